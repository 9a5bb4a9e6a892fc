"""The services a run needs on the host: the inference engine and the recording proxy (started or reused)."""
from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

ROOT = Path(__file__).resolve().parents[1]


class ServiceError(RuntimeError):
    pass


@dataclass(frozen=True)
class ProxyHandle:
    """A running Polar proxy as a run sees it."""

    host: str
    proxy_port: int  # HTTPS_PROXY listener
    base_url_port: int  # base-URL listener
    ca_cert: Path
    capture_dir: Path
    sessions: str  # "open" or the redis:// / unix:// URL the proxy reads sessions from


@dataclass(frozen=True)
class Session:
    task_id: str
    session_id: str
    token: str


def new_session(proxy: ProxyHandle, task_id: str, session_id: str) -> Session:
    """A registered session (Redis) or, in open mode, a fresh name and secret."""
    if proxy.sessions == "open":
        return Session("local", session_id, "polar-" + secrets.token_urlsafe(18))
    from polar_mitm.sessions import register_session

    token = register_session(proxy.sessions, task_id, session_id)
    return Session(task_id, session_id, token)


def context_view(model_dir: Path, context_length: int, dest: Path) -> Path:
    """The model directory with `max_position_embeddings` raised (files symlinked, config.json rewritten), so
    long harness prompts fit a small test model. RoPE models take any position; the weights are unchanged.
    Returns model_dir itself when nothing needs to change."""
    config = json.loads((model_dir / "config.json").read_text())
    if not context_length or int(config.get("max_position_embeddings", 0)) >= context_length:
        return model_dir
    view = dest / model_dir.resolve().name  # the served model name is the directory name
    view.mkdir(parents=True, exist_ok=True)
    for item in model_dir.iterdir():
        if item.name != "config.json" and not (view / item.name).exists():
            (view / item.name).symlink_to(item.resolve())
    config["max_position_embeddings"] = context_length
    tmp = view / "config.json.tmp"
    tmp.write_text(json.dumps(config, indent=2))
    tmp.replace(view / "config.json")
    return view


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def wait_for_port(host: str, port: int, proc: subprocess.Popen, log: Path, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ServiceError(f"exited with {proc.returncode}; log {log}:\n{_tail(log)}")
        try:
            with socket.create_connection((host, port), timeout=0.5) as s:
                # connecting to a free ephemeral port can "succeed" by connecting the socket to itself
                if s.getsockname() != s.getpeername():
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise ServiceError(f"nothing listens on {host}:{port} after {timeout:.0f}s; log {log}:\n{_tail(log)}")


def wait_for_file(path: Path, proc: subprocess.Popen, log: Path, timeout: float = 30.0) -> None:
    """mitmproxy writes its CA just after its listeners are up."""
    deadline = time.monotonic() + timeout
    while not path.is_file():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise ServiceError(f"no {path} (exit {proc.poll()}); log {log}:\n{_tail(log)}")
        time.sleep(0.05)


def _tail(log: Path, n: int = 3000) -> str:
    try:
        return log.read_text(errors="replace")[-n:]
    except OSError:
        return ""


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@contextmanager
def reference_server(model_dir: Path, policy: Path | None, log: Path) -> Iterator[str]:
    """`polar serve` on 127.0.0.1 and a free port; yields its base URL."""
    from polar_serve.launch import ServerFailed, reference_server as launch

    try:
        with launch(model_dir, policy, log_path=log) as url:
            yield url
    except ServerFailed as e:
        raise ServiceError(f"reference server: {e}") from e


@contextmanager
def start_proxy(tokenizer: Path, backend: str, capture_dir: Path, confdir: Path, log: Path,
                sessions: str = "open", engine: str = "sglang", host: str = "127.0.0.1") -> Iterator[ProxyHandle]:
    """`polar proxy` on two free ports; yields its handle. `sessions`: "open" or a redis:// / unix:// URL."""
    p1, p2 = free_port(host), free_port(host)
    cmd = [sys.executable, "-m", "polar.cli", "proxy", "--tokenizer", str(tokenizer), "--backend", backend,
           "--engine", engine,
           "--capture-dir", str(capture_dir), "--sessions", sessions, "--host", host,
           "--proxy-port", str(p1), "--base-url-port", str(p2), "--confdir", str(confdir)]
    log.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    try:
        try:
            wait_for_port(host, p1, proc, log)
            wait_for_port(host, p2, proc, log)
            ca = confdir / "mitmproxy-ca-cert.pem"
            wait_for_file(ca, proc, log)
        except ServiceError as e:
            raise ServiceError(f"proxy: {e}") from e
        yield ProxyHandle(host, p1, p2, ca, capture_dir, sessions)
    finally:
        _stop(proc)
