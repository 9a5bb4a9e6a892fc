"""The services a run needs on the host: the inference engine and the recording proxy (started or reused)."""
from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator
from urllib.parse import urlsplit

from polar.sandbox import supervisor
from polar_traj import atomic
from polar_mitm.launch import (PARENT_ENV, PORT_ATTEMPTS, ProxyProcess, free_port, port_taken, stop, wait_for_file,
                               wait_for_port)
from polar_mitm.sessions.registry import register_session
from polar_mitm.sessions.sampling import parse_sampling, session_sampling

ROOT = Path(__file__).resolve().parents[2]


class ServiceError(RuntimeError):
    pass


def running_proxy(proxy_url: str, base_url: str, capture_dir: Path, ca: Path, sessions: str,
                  names: tuple[str, str, str] = ("--proxy", "--proxy-base-url", "--proxy-ca")) -> ProxyProcess:
    """A `polar proxy` already running, named by its two listeners' URLs (http://HOST:PORT) and its CA file;
    ValueError naming the setting (`names`) that is wrong."""
    host, proxy_port = _listener(proxy_url, names[0])
    _, base_port = _listener(base_url, names[1])
    if not ca.is_file():
        raise ValueError(f"{names[2]}: {ca} not found")
    return ProxyProcess(host, proxy_port, base_port, ca, capture_dir, sessions)


def _listener(url: str, name: str) -> tuple[str, int]:
    parts = urlsplit(url if "://" in url else f"http://{url}")
    if not parts.hostname or not parts.port:
        raise ValueError(f"{name}: expected http://HOST:PORT, got {url!r}")
    return parts.hostname, parts.port


@dataclass(frozen=True)
class SessionLogin:
    """What one harness logs in to the proxy with: `session_id` as the proxy-auth user, `token` as its password
    (the proxy's own view of the session is polar_mitm/sessions/registry.py's Session)."""

    task_id: str
    session_id: str
    token: str


def new_session(proxy: ProxyProcess, task_id: str, session_id: str, max_calls: int | None = None,
                sampling: dict[str, Any] | None = None) -> SessionLogin:
    """A registered session (Redis) or, in open mode, a fresh name and secret. `max_calls`: the session's LLM call
    cap; `sampling`: values every call is sampled with (polar_mitm/sessions/sampling.py). Open mode has no registry to
    carry them: it enforces no cap, and fixed sampling is refused (ValueError)."""
    fixed = parse_sampling(sampling)
    if proxy.sessions == "open":
        if fixed is not None:
            raise ValueError("fixed sampling needs a proxy with registered sessions (--sessions redis://…), "
                             "not one in open mode")
        return SessionLogin("local", session_id, "polar-" + secrets.token_urlsafe(18))
    token = register_session(proxy.sessions, task_id, session_id, sampling=session_sampling(fixed, session_id),
                             max_calls=max_calls)
    return SessionLogin(task_id, session_id, token)


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
    atomic.write_text(view / "config.json", json.dumps(config, indent=2))
    return view


@contextmanager
def reference_server(model_dir: Path, policy: Path | None, log: Path) -> Iterator[str]:
    """`polar serve` on 127.0.0.1 and a free port; yields its base URL."""
    from polar_serve.launch import ServerFailed, reference_server as launch

    watches: list[supervisor.Watch] = []
    try:
        with launch(model_dir, policy, log_path=log, on_start=lambda pid: watches.append(
                supervisor.watch_process(pid))) as url:
            yield url
    except ServerFailed as e:
        raise ServiceError(f"reference server: {e}") from e
    finally:
        for watch in watches:
            watch.release()


# How long a live proxy may take to listen. It reads its tokenizer first: a GGUF file is converted on first use, which
# took over 90 s on 2 loaded cores (CI, beside a reference server sampling). One that dies is reported at once.
PROXY_START_S = 300.0


@contextmanager
def start_proxy(tokenizer: Path, backend: str, capture_dir: Path, confdir: Path, log: Path,
                sessions: str = "open", engine: str = "sglang", host: str = "127.0.0.1",
                render: str = "proxy") -> Iterator[ProxyProcess]:
    """`polar proxy` on two free ports; yields it. `sessions`: "open" or a redis:// / unix:// URL;
    `render`: proxy, or engine (the engine's chat API renders and parses, polar_mitm/engines/chat.py)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", PARENT_ENV: str(os.getpid())}
    status_file = log.with_name(f"{log.stem}.status.json")
    for attempt in range(PORT_ATTEMPTS):
        # A free port is only free until someone binds it: another process's outgoing connection or listener can
        # take it between free_port() and mitmproxy's bind, so a lost race is retried on two fresh ports.
        p1, p2 = free_port(), free_port()  # host is always loopback here
        cmd = [sys.executable, "-m", "polar.cli", "proxy", "--tokenizer", str(tokenizer), "--backend", backend,
               "--engine", engine, "--render", render,
               "--capture-dir", str(capture_dir), "--sessions", sessions, "--host", host,
               "--proxy-port", str(p1), "--base-url-port", str(p2), "--confdir", str(confdir),
               "--status-file", str(status_file)]
        with open(log, "wb") as out:
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
        watch = supervisor.watch_process(proc.pid)  # it also dies with us (die_with_parent): this is for its port
        try:
            wait_for_port(p1, proc, log, PROXY_START_S, host)
            wait_for_port(p2, proc, log, PROXY_START_S, host)
            ca = confdir / "mitmproxy-ca-cert.pem"
            wait_for_file(ca, proc, log)
            break
        except RuntimeError as e:
            stop(proc)
            watch.release()
            if attempt + 1 < PORT_ATTEMPTS and port_taken(log):
                continue
            raise ServiceError(f"proxy: {e}") from e
    try:
        yield ProxyProcess(host, p1, p2, ca, capture_dir, sessions, status_file, pid=proc.pid, backend=backend,
                           log=log)
    finally:
        stop(proc)
        watch.release()


@contextmanager
def worker_node(env: dict[str, str], log: Path, concurrency: int, cwd: Path,
                timeout_s: float = 300.0) -> Iterator[subprocess.Popen]:
    """One `celery -A workers worker` node named by env's POLAR_NODE (it starts its own proxy), ready when its
    log says so; warm-shutdown (SIGTERM, so it stops its proxy) on the way out, killed if that hangs."""
    cmd = [sys.executable, "-m", "celery", "-A", "workers", "worker", "-n", f"{env['POLAR_NODE']}@%h",
           "-c", str(concurrency), "-P", "prefork", "--loglevel", "INFO", "--without-gossip", "--without-mingle"]
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    watch = supervisor.watch_process(proc.pid)  # SIGTERM first: the node stops its own proxy and sandboxes
    try:
        deadline = time.monotonic() + timeout_s
        while " ready." not in log.read_text(errors="replace"):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the worker node did not start; its log: {log}\n"
                                   f"{log.read_text(errors='replace')[-2000:]}")
            time.sleep(0.3)
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
        watch.release()
