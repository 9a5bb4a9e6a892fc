"""This node's proxies: one by default, POLAR_PROXIES=K when one process is not enough (history substitution is
per proxy process, so each sample keeps to one of them: for_sample), started when the worker starts with sessions
and the fence in Redis, or a running `polar proxy` named by POLAR_PROXY. Pool processes fork from the worker's
main process after it started, so they inherit the handles."""
from __future__ import annotations

import contextlib
import zlib
from pathlib import Path
from typing import Any

from polar.run.services import running_proxy, start_proxy
from polar.sandbox import supervisor
from polar_mitm.launch import ProxyProcess
from polar_mitm.status_file import read_status
from workers.settings import WorkerSettings

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
# what a heartbeat carries of a proxy's status (polar_mitm/status_file.py)
STATUS_FIELDS = ("state", "age_s", "pid", "rss_bytes", "histories", "history_bytes", "history_budget_bytes", "evicted")
_stack = contextlib.ExitStack()
_proxies: list[ProxyProcess] = []


def node_dir(settings: WorkerSettings) -> Path:
    return settings.output_root / "nodes" / settings.node


def _suffix(k: int) -> str:
    return "" if k == 0 else f"-{k}"  # the first proxy keeps the one-proxy names


def log_path(settings: WorkerSettings, k: int = 0) -> Path | None:
    """Proxy k's log; None for a running `polar proxy` (POLAR_PROXY), which logs where it was started."""
    return None if settings.proxy else node_dir(settings) / f"proxy{_suffix(k)}.log"


def reused_proxy(spec: str, sessions: str) -> ProxyProcess:
    """POLAR_PROXY=http://HOST:PORT,http://HOST:PORT,CAPTURE_DIR[,CA]: a proxy started with --sessions `sessions`."""
    fields = spec.split(",")
    if len(fields) not in (3, 4):
        raise ValueError(f"POLAR_PROXY {spec!r}: expected PROXY_URL,BASE_URL_URL,CAPTURE_DIR[,CA_FILE]")
    ca = Path(fields[3]) if len(fields) == 4 else Path("~/.polar/mitmproxy/mitmproxy-ca-cert.pem").expanduser()
    return running_proxy(fields[0], fields[1], Path(fields[2]), ca, sessions, ("POLAR_PROXY",) * 3)


def model_problem(model_dir: Path) -> str | None:
    """Why POLAR_MODEL_DIR cannot give the proxy a tokenizer (None when it can): checked before the proxy starts,
    so a node with a wrong path says so in one line instead of failing every sample it takes."""
    if not model_dir.exists():
        return f"POLAR_MODEL_DIR {model_dir}: no such file or directory"
    if model_dir.is_dir() and not any((model_dir / name).is_file() for name in TOKENIZER_FILES):
        return f"POLAR_MODEL_DIR {model_dir}: no tokenizer there (expected {' or '.join(TOKENIZER_FILES)})"
    return None


def start(settings: WorkerSettings) -> list[ProxyProcess]:
    """Start (or adopt) the node's proxies, POLAR_PROXIES of them; idempotent within a process. One after the
    other: the first makes the CA the others then load from the same confdir."""
    supervisor.start_supervisor()  # before the pool forks: what a killed node started is stopped by it
    if not _proxies:
        if settings.proxy:
            _proxies.append(reused_proxy(settings.proxy, settings.sessions))
        base = node_dir(settings)
        for k in range(len(_proxies), settings.proxies):
            _proxies.append(_stack.enter_context(start_proxy(
                settings.model_dir, settings.engine_url, base / f"captures{_suffix(k)}", settings.confdir,
                log_path(settings, k), sessions=settings.sessions, engine=settings.engine, render=settings.render)))
    return list(_proxies)


def for_sample(sample_id: str) -> ProxyProcess:
    """The proxy a sample's calls go through: always the same one for a sample id, so every stage and attempt of
    it on this node meets the process that holds its session's history."""
    if not _proxies:
        raise RuntimeError("this worker's proxy is not running (workers.node.start runs at worker start)")
    return _proxies[zlib.crc32(sample_id.encode()) % len(_proxies)]


def current() -> ProxyProcess:
    """The node's first proxy."""
    if not _proxies:
        raise RuntimeError("this worker's proxy is not running (workers.node.start runs at worker start)")
    return _proxies[0]


def proxy_statuses() -> list[dict[str, Any]]:
    """The status files of the proxies this node started, each with its index among the node's proxies (a
    running `polar proxy` it was given, POLAR_PROXY, has no status file here)."""
    return [{"index": k, **{f: v for f, v in read_status(p.status_file).items() if f in STATUS_FIELDS}}
            for k, p in enumerate(_proxies) if p.status_file is not None]


def stop() -> None:
    _stack.close()
    _proxies.clear()
