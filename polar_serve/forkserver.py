"""A warm fork server for `polar serve`: one process imports PyTorch and transformers once (~3.5 CPU-s, most of
a reference server's start on 2 cores), then forks a ready child for each server a client asks for.

`python -m polar_serve.forkserver --socket PATH` listens on a Unix socket; polar_serve.launch uses it when
POLAR_SERVE_FORKSERVER names that socket (the test suite sets it: its ~80 server starts through launch cost
~270 CPU-s without it) and starts a plain process otherwise. A child behaves as `python -m polar_serve ARGS` would: the
client's argv, environment, working directory, stdout and stderr (passed as file descriptors); it dies with the
client's connection or with this server. Fork safety: this process imports and never computes (no torch thread
pool, no event loop, one thread), and it serves only a client it matches exactly (same interpreter, uid, network
namespace and every environment variable that module imports read), else it refuses and the client starts a
process. The protocol, one JSON line each way: request {"args", "env", "cwd", "python", "uid", "netns"} with
the two descriptors; reply {"pid"} or {"refused"}; later {"signal": N} from the client, {"exit": CODE} (as
Popen.returncode) from here.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import selectors
import signal
import socket
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ENV_VAR = "POLAR_SERVE_FORKSERVER"
# Read when modules are imported, so a child inherits this server's values: a client must have the same ones.
IMPORT_TIME_ENV = ("HF_", "TRANSFORMERS_", "TORCH", "PYTORCH_", "OMP_", "MKL_", "TOKENIZERS_", "PYTHON")
MAX_REQUEST = 1 << 20


def netns() -> str:
    try:
        return os.readlink("/proc/self/ns/net")
    except OSError:
        return ""


def interpreter() -> str:
    """Which Python and environment: `python` and `python3` of one venv are the same to a child."""
    return f"{os.path.realpath(sys.executable)} {sys.prefix}"


def import_time_env(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith(IMPORT_TIME_ENV)}


def _preload() -> None:
    """What a reference server imports on its way to listening (the architecture of the fixture models too)."""
    import aiohttp.web  # noqa: F401
    import torch  # noqa: F401
    import transformers.masking_utils  # noqa: F401
    import transformers.modeling_utils  # noqa: F401
    import transformers.models.qwen2.modeling_qwen2  # noqa: F401
    from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: F401

    import polar_serve.__main__  # noqa: F401
    import polar_serve.engine  # noqa: F401
    import polar_serve.server  # noqa: F401


@dataclass
class _Child:
    pid: int
    conn: socket.socket


def _send(conn: socket.socket, message: dict[str, Any]) -> None:
    try:
        conn.sendall(json.dumps(message).encode() + b"\n")
    except OSError:
        pass  # the client is gone; its child is stopped when its connection reads as closed


def _read_request(conn: socket.socket) -> tuple[dict[str, Any], list[int]]:
    data, fds = b"", []
    conn.settimeout(10)
    while not data.endswith(b"\n"):
        chunk, new_fds, _, _ = socket.recv_fds(conn, 65536, 4)
        fds += new_fds
        if not chunk or len(data) + len(chunk) > MAX_REQUEST:
            break
        data += chunk
    conn.settimeout(None)
    return json.loads(data), fds


def _refusal(request: dict[str, Any], fds: list[int], startup_env: dict[str, str],
             set_by_imports: dict[str, str]) -> str | None:
    if len(fds) != 2:
        return f"expected stdout and stderr descriptors, got {len(fds)}"
    if not (isinstance(request, dict) and isinstance(request.get("args"), list)
            and all(isinstance(a, str) for a in request["args"]) and isinstance(request.get("cwd"), str)
            and isinstance(request.get("env"), dict)
            and all(isinstance(k, str) and isinstance(v, str) for k, v in request["env"].items())):
        return "a malformed request"
    if request.get("python") != interpreter():
        return f"another interpreter ({request.get('python')}, this one is {interpreter()})"
    if request.get("uid") != os.getuid():
        return "another user"
    if request.get("netns") != netns():
        return "another network namespace (the server's port would not be reachable)"
    theirs, ours = import_time_env(request.get("env", {})), import_time_env(startup_env)
    differ = sorted(k for k in theirs.keys() | ours.keys() if k != "PYTHONPATH" and theirs.get(k) != ours.get(k)
                    # a client that imported torch itself has what that import set: the child gets it too
                    and not (k in set_by_imports and theirs.get(k) == set_by_imports[k]))
    if differ:
        return f"another value of {', '.join(differ)}, which imports read"
    if not _on_path(theirs.get("PYTHONPATH", "")):
        return "a PYTHONPATH entry that is not on this server's sys.path"
    return None


def _on_path(pythonpath: str) -> bool:
    """Whether every entry of a client's PYTHONPATH is on sys.path here (a child imports from this one)."""
    here = {os.path.realpath(p or ".") for p in sys.path}
    return all(os.path.realpath(p) in here for p in pythonpath.split(os.pathsep) if p)


def _run_child(request: dict[str, Any], fds: list[int], to_close: list[socket.socket],
               selector: selectors.BaseSelector, set_by_imports: dict[str, str]) -> None:
    """In the forked child: become `python -m polar_serve ARGS`; never returns."""
    code = 1
    try:
        selector.close()
        for s in to_close:
            s.close()
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD):
            signal.signal(sig, signal.SIG_DFL)
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG: go when this server goes
        libc.prctl(15, b"polar serve")  # PR_SET_NAME: what ps and top call it (its cmdline is this server's)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(fds[0], 1)
        os.dup2(fds[1], 2)
        for fd in (devnull, *fds):
            os.close(fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update({**set_by_imports, **request["env"]})
        import random
        random.seed()  # fresh state, as a new process would have; torch seeds itself per process likewise
        import torch
        torch.seed()
        from polar_serve.__main__ import main
        sys.argv = ["polar_serve", *request["args"]]
        code = main(list(request["args"]))
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:  # noqa: BLE001 — a child must never return into the server's loop
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def serve(path: Path) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    startup_env = dict(os.environ)
    _preload()
    set_by_imports = {k: v for k, v in os.environ.items() if k not in startup_env}  # TORCHINDUCTOR_CACHE_DIR
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    path.unlink(missing_ok=True)
    listener.bind(str(path))
    os.chmod(path, 0o600)
    listener.listen(64)
    stopping = False

    def stop(*_: Any) -> None:
        nonlocal stopping
        stopping = True
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    children: dict[int, _Child] = {}  # by pid; the selector holds each child's connection with it as data
    forked, refused = 0, dict[str, int]()  # refused: reason -> clients; the line at the end says what it served
    print(f"polar serve forkserver: listening on {path}", flush=True)
    while not stopping:
        for key, _ in selector.select(timeout=0.2):
            sock: socket.socket = key.fileobj  # type: ignore[assignment]
            if sock is listener:
                conn, _ = listener.accept()
                try:
                    request, fds = _read_request(conn)
                except (OSError, ValueError) as e:
                    _send(conn, {"refused": f"bad request: {e}"})
                    conn.close()
                    continue
                problem = _refusal(request, fds, startup_env, set_by_imports)
                if problem:
                    refused[problem] = refused.get(problem, 0) + 1
                    _send(conn, {"refused": problem})
                    for fd in fds:
                        os.close(fd)
                    conn.close()
                    continue
                sys.stdout.flush()
                sys.stderr.flush()
                forked += 1
                pid = os.fork()
                if pid == 0:
                    _run_child(request, fds, [listener, *(c.conn for c in children.values()), conn], selector,
                               set_by_imports)
                for fd in fds:
                    os.close(fd)
                child = children[pid] = _Child(pid, conn)
                selector.register(conn, selectors.EVENT_READ, child)
                _send(conn, {"pid": pid})
            else:
                child = key.data
                try:
                    data = sock.recv(4096)
                except OSError:
                    data = b""
                if not data:  # the client is gone: its server goes too (as a child of it would)
                    _signal(child, signal.SIGTERM)
                    selector.unregister(sock)
                    continue
                for line in data.splitlines():
                    try:
                        _signal(child, int(json.loads(line)["signal"]))
                    except (ValueError, KeyError, TypeError):
                        pass
        _reap(children, selector)
    for child in children.values():
        _signal(child, signal.SIGKILL)
    listener.close()
    path.unlink(missing_ok=True)
    why = "; ".join(f"{n}x {reason}" for reason, n in sorted(refused.items(), key=lambda kv: -kv[1]))
    print(f"polar serve forkserver: forked {forked} servers, refused {sum(refused.values())} clients"
          + (f" ({why})" if why else ""), file=sys.stderr, flush=True)
    return 0


def _signal(child: _Child, sig: int) -> None:
    try:  # only a child not yet reaped, so its pid cannot have been reused
        os.kill(child.pid, sig)
    except OSError:
        pass


def _reap(children: dict[int, _Child], selector: selectors.BaseSelector) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        child = children.pop(pid, None)
        if child is None:
            continue
        _send(child.conn, {"exit": os.waitstatus_to_exitcode(status)})
        with contextlib.suppress(KeyError):  # unregistered already when its client went first
            selector.unregister(child.conn)
        child.conn.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m polar_serve.forkserver", description=__doc__.split("\n")[0])
    parser.add_argument("--socket", type=Path, required=True, help="the Unix socket to listen on")
    return serve(parser.parse_args(argv).socket)


if __name__ == "__main__":
    sys.exit(main())
