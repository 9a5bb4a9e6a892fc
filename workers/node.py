"""This node's proxy: one per node (history substitution is per proxy process), started when the worker starts
with sessions and the fence in Redis, or a running `polar proxy` named by POLAR_PROXY. Pool processes fork
from the worker's main process after it started, so they inherit the handle."""
from __future__ import annotations

import contextlib
from pathlib import Path

from polar.run.services import ProxyHandle, running_proxy, start_proxy
from workers.settings import WorkerSettings

_stack = contextlib.ExitStack()
_proxy: ProxyHandle | None = None


def node_dir(settings: WorkerSettings) -> Path:
    return settings.output_root / "nodes" / settings.node


def log_path(settings: WorkerSettings) -> Path | None:
    """The node proxy's log; None for a running `polar proxy` (POLAR_PROXY), which logs where it was started."""
    return None if settings.proxy else node_dir(settings) / "proxy.log"


def reused_proxy(spec: str, sessions: str) -> ProxyHandle:
    """POLAR_PROXY=http://HOST:PORT,http://HOST:PORT,CAPTURE_DIR[,CA]: a proxy started with --sessions `sessions`."""
    fields = spec.split(",")
    if len(fields) not in (3, 4):
        raise ValueError(f"POLAR_PROXY {spec!r}: expected PROXY_URL,BASE_URL_URL,CAPTURE_DIR[,CA_FILE]")
    ca = Path(fields[3]) if len(fields) == 4 else Path("~/.polar/mitmproxy/mitmproxy-ca-cert.pem").expanduser()
    return running_proxy(fields[0], fields[1], Path(fields[2]), ca, sessions, ("POLAR_PROXY",) * 3)


def start(settings: WorkerSettings) -> ProxyHandle:
    """Start (or adopt) the node's proxy; idempotent within a process."""
    global _proxy
    if _proxy is None:
        if settings.proxy:
            _proxy = reused_proxy(settings.proxy, settings.sessions)
        else:
            base = node_dir(settings)
            _proxy = _stack.enter_context(start_proxy(
                settings.model_dir, settings.engine_url, base / "captures", settings.confdir, log_path(settings),
                sessions=settings.sessions, engine=settings.engine))
    return _proxy


def current() -> ProxyHandle:
    if _proxy is None:
        raise RuntimeError("this worker's proxy is not running (workers.node.start runs at worker start)")
    return _proxy


def stop() -> None:
    global _proxy
    _stack.close()
    _proxy = None
