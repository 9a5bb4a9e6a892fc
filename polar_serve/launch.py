"""Start `polar serve` as a child process on 127.0.0.1 and a free port (tests, the demo, the bench)."""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Callable, Iterator

READY_PREFIX = "polar serve: listening on "


class ServerFailed(RuntimeError):
    pass


def _wait_ready(proc: subprocess.Popen[str], log: IO[str], timeout: float) -> str:
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


@contextmanager
def reference_server(model_dir: str | Path, policy: str | Path | None = None, extra_args: tuple[str, ...] = (),
                     timeout: float = 120.0, log_path: str | Path | None = None,
                     on_start: Callable[[int], None] | None = None) -> Iterator[str]:
    """Run the reference server; yields its base URL (http://127.0.0.1:PORT). Its stderr goes to log_path
    (a temporary file by default), so a chatty server can never block on a full pipe. `on_start(pid)`: called
    as soon as it started (polar run registers it with its watchdog)."""
    cmd = [sys.executable, "-m", "polar_serve", "serve", "--model", str(model_dir), "--host", "127.0.0.1",
           "--port", "0", *(["--policy", str(policy)] if policy else []), *extra_args]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    log = open(log_path, "w+") if log_path else tempfile.TemporaryFile("w+")  # noqa: SIM115 — closed below
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True, env=env)
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
