"""Start `polar serve` as a child process on 127.0.0.1 and a free port (tests, the demo, the bench), forked from
the warm fork server named by POLAR_SERVE_FORKSERVER when there is one that serves us (polar_serve.forkserver)."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any, Callable, Iterator

from polar_serve.forkserver import ENV_VAR as FORKSERVER_ENV, interpreter, netns

READY_PREFIX = "polar serve: listening on "


class ServerFailed(RuntimeError):
    pass


def _wait_ready(proc: subprocess.Popen[str] | ForkedProcess, log: IO[str], timeout: float) -> str:
    """The base URL from the server's first stdout line, or ServerFailed with the end of its log."""
    line: list[str] = []
    stdout = proc.stdout
    assert stdout is not None
    reader = threading.Thread(target=lambda: line.append(stdout.readline()), daemon=True)
    reader.start()
    reader.join(timeout)
    text = line[0] if line else ""
    if not text.startswith(READY_PREFIX):
        proc.kill()
        proc.wait()
        log.seek(0)
        raise ServerFailed(f"polar serve did not start within {timeout:.0f}s (exit {proc.returncode}): "
                           f"{text!r}\n{log.read()[-3000:]}")
    return text[len(READY_PREFIX):].split()[0]


class _Messages:
    """JSON lines from a socket."""

    def __init__(self, conn: socket.socket) -> None:
        self.conn, self.buffer = conn, b""

    def read(self) -> dict[str, Any]:
        while b"\n" not in self.buffer:
            chunk = self.conn.recv(4096)
            if not chunk:
                raise ValueError("the fork server closed the connection")
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return json.loads(line)


class ForkedProcess:
    """A server forked by the fork server, with the part of Popen's interface launch uses. Signals go through
    the fork server, which sends them only to a child it has not reaped (a reused pid is never signalled)."""

    def __init__(self, messages: _Messages, pid: int, stdout: IO[str]) -> None:
        self.messages, self.pid, self.stdout = messages, pid, stdout
        self.returncode: int | None = None

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            try:
                self.messages.conn.sendall(json.dumps({"signal": int(sig)}).encode() + b"\n")
            except OSError:
                pass  # the fork server is gone, and its children with it

    def terminate(self) -> None:
        self.send_signal(15)

    def kill(self) -> None:
        self.send_signal(9)

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self.messages.conn.settimeout(timeout)
            try:
                self.returncode = int(self.messages.read()["exit"])
            except socket.timeout:
                raise subprocess.TimeoutExpired("polar serve (forked)", timeout or 0) from None
            except (OSError, ValueError, KeyError):
                self.returncode = -9  # the fork server died, and PR_SET_PDEATHSIG took the child with it
            self.messages.conn.close()
        return self.returncode


def _forked(args: list[str], env: dict[str, str], log: IO[str]) -> ForkedProcess | None:
    """`python -m polar_serve ARGS` forked by the fork server, or None (no server, or it does not serve us)."""
    path = os.environ.get(FORKSERVER_ENV)
    if not path:
        return None
    read_fd, write_fd = os.pipe()
    messages = _Messages(socket.socket(socket.AF_UNIX, socket.SOCK_STREAM))
    try:
        messages.conn.settimeout(10)
        messages.conn.connect(path)
        request = {"args": args, "env": env, "cwd": os.getcwd(), "python": interpreter(), "uid": os.getuid(),
                   "netns": netns()}
        socket.send_fds(messages.conn, [json.dumps(request).encode() + b"\n"], [write_fd, log.fileno()])
        reply = messages.read()
        if "pid" not in reply:
            raise ValueError(f"refused: {reply.get('refused')}")
    except (OSError, ValueError) as e:
        messages.conn.close()
        os.close(read_fd)
        log.write(f"fork server {path}: {e}; starting a process\n")
        log.flush()
        return None
    finally:
        os.close(write_fd)
    return ForkedProcess(messages, int(reply["pid"]), os.fdopen(read_fd, "r"))


@contextmanager
def reference_server(model_dir: str | Path, policy: str | Path | None = None, extra_args: tuple[str, ...] = (),
                     timeout: float = 120.0, log_path: str | Path | None = None,
                     on_start: Callable[[int], None] | None = None) -> Iterator[str]:
    """Run the reference server; yields its base URL (http://127.0.0.1:PORT). Its stderr goes to log_path
    (a temporary file by default), so a chatty server can never block on a full pipe. `on_start(pid)`: called
    as soon as it started (polar run registers it with its watchdog)."""
    args = ["serve", "--model", str(model_dir), "--host", "127.0.0.1", "--port", "0",
            *(["--policy", str(policy)] if policy else []), *extra_args]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    log = open(log_path, "w+") if log_path else tempfile.TemporaryFile("w+")  # noqa: SIM115 — closed below
    proc: subprocess.Popen[str] | ForkedProcess | None = _forked(args, env, log)
    if proc is None:
        proc = subprocess.Popen([sys.executable, "-m", "polar_serve", *args], stdout=subprocess.PIPE, stderr=log,
                                text=True, env=env)
    if on_start is not None:
        on_start(proc.pid)
    try:
        yield _wait_ready(proc, log, timeout)
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout:
            proc.stdout.close()
        log.close()
