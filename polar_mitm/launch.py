"""Start mitmdump with Polar's addon as a child process on 127.0.0.1 (tests, bench, demo, runner), and
`ProxyProcess`, the one type every side uses for a running proxy."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Iterator

from polar_mitm.engines.backends import parse_backends

ADDON = Path(__file__).resolve().parent / "addon.py"


PEM_END = b"-----END CERTIFICATE-----"  # a CA file is whole once its certificate ends

def free_port() -> int:
    """A loopback port free now. Only now: a launcher retries on fresh ports when its child's bind lost the race
    (`port_taken`), up to PORT_ATTEMPTS times."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


PORT_ATTEMPTS = 3


def port_taken(log: Path) -> bool:
    """Whether a child's log says its listener's port was taken before it could bind it."""
    return "address already in use" in _tail(log).lower()


@dataclass(frozen=True)
class ProxyProcess:
    """A running Polar proxy: its two listeners on `host`, the CA harnesses trust, where it writes captures and
    where it reads sessions. Started here or by polar/run/services.py; a reused one (`polar run --proxy`, a worker
    node's POLAR_PROXY) has no pid, backend or log this process knows."""

    host: str
    proxy_port: int  # HTTPS_PROXY listener
    base_url_port: int  # base-URL listener
    ca_cert: Path
    capture_dir: Path
    sessions: str = "open"  # "open" or the redis:// / unix:// URL the proxy reads sessions from
    status_file: Path | None = None  # rewritten by a proxy that was given one (polar_mitm/status_file.py)
    pid: int | None = None
    backend: str | None = None  # the engine URL(s) it was started with
    log: Path | None = None

    def proxy_url(self, session: str, token: str) -> str:
        return f"http://{session}:{token}@{self.host}:{self.proxy_port}"

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.base_url_port}"

    def to_dict(self) -> dict[str, Any]:
        """JSON values (a sample's state.json keeps its proxy)."""
        return {f.name: str(v) if isinstance(v, Path) else v for f in fields(self) for v in [getattr(self, f.name)]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ProxyProcess":
        return cls(**{k: Path(v) if k in _PATHS and v is not None else v for k, v in data.items()})


_PATHS = {"ca_cert", "capture_dir", "status_file", "log"}


def wait_for_port(port: int, proc: subprocess.Popen, log: Path, timeout: float = 60.0, host: str = "127.0.0.1") -> None:
    """Until something listens on host:port; RuntimeError with the end of `log` if the process dies first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"exited with {proc.returncode}; log {log}:\n{_tail(log)}")
        try:
            with socket.create_connection((host, port), timeout=0.2) as s:
                # A connect to a free ephemeral port can land on itself (TCP simultaneous open): not a listener.
                if s.getsockname() != s.getpeername():
                    return
        except OSError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"nothing listens on {host}:{port} after {timeout:.0f}s; log {log}:\n{_tail(log)}")


def wait_for_file(path: Path, proc: subprocess.Popen, log: Path, timeout: float = 30.0) -> None:
    """mitmproxy writes its CA just after its listeners are up, in place: wait until the PEM is whole. (Once,
    under load, a sample copied the CA while it was still empty, and every TLS handshake of its harness failed.)"""
    deadline = time.monotonic() + timeout
    while not _whole_pem(path):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"no whole {path} (exit {proc.poll()}); log {log}:\n{_tail(log)}")
        time.sleep(0.05)


def _whole_pem(path: Path) -> bool:
    try:
        return PEM_END in path.read_bytes()
    except OSError:
        return False


def _tail(log: Path, n: int = 3000) -> str:
    try:
        return log.read_text(errors="replace")[-n:]
    except OSError:
        return ""


def start_proxy(workdir: Path, backend: str, model_dir: Path, *extra: str, hosts_file: Path | None = None,
                reverse_target: str | None = None, quiet: bool = True) -> tuple[subprocess.Popen, ProxyProcess]:
    """mitmdump on two fresh loopback ports; the caller stops the returned process.

    `hosts_file` (tests, root only): run it in a private mount namespace where that file is /etc/hosts, so a
    provider hostname can point at a local listener. `reverse_target`: the base-URL listener's target
    (default the engine; Polar never forwards to it, see polar_mitm/gate/egress.py)."""
    workdir.mkdir(parents=True, exist_ok=True)
    confdir, capture, log = workdir / "mitm", workdir / "captures", workdir / "mitmdump.log"
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    for attempt in range(PORT_ATTEMPTS):
        p1, p2 = free_port(), free_port()
        cmd = [
            str(Path(sys.executable).parent / "mitmdump"), *(["-q"] if quiet else ["--set", "flow_detail=0"]), "-s", str(ADDON),
            "--mode", f"regular@127.0.0.1:{p1}", "--mode", f"reverse:{reverse_target or parse_backends(backend)[0]}@127.0.0.1:{p2}",
            "--set", f"confdir={confdir}", "--set", "connection_strategy=lazy",
            "--set", f"polar_backend={backend}", "--set", f"polar_tokenizer={model_dir}",
            "--set", f"polar_capture_dir={capture}", *extra,
        ]
        if hosts_file is not None:
            cmd = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                   'mount --bind "$0" /etc/hosts && exec "$@"', str(hosts_file), *cmd]
        with open(log, "wb") as out:
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=workdir)
        try:
            wait_for_port(p1, proc, log)
            wait_for_port(p2, proc, log)
            wait_for_file(confdir / "mitmproxy-ca-cert.pem", proc, log)
            break
        except RuntimeError:
            proc.kill()
            proc.wait()
            if attempt + 1 < PORT_ATTEMPTS and port_taken(log):
                continue
            raise
    sessions = next((a.partition("=")[2] for a in reversed(extra) if a.startswith("polar_sessions=")), "open")
    return proc, ProxyProcess("127.0.0.1", p1, p2, confdir / "mitmproxy-ca-cert.pem", capture, sessions,
                              pid=proc.pid, backend=backend, log=log)


PARENT_ENV = "POLAR_PARENT_PID"


def die_with_parent() -> None:
    """In a child started with POLAR_PARENT_PID set: get SIGTERM when that parent dies, even by SIGKILL (Linux),
    so a killed worker or `polar run` leaves no proxy behind holding its ports. Runs in the child itself
    (a preexec_fn is unsafe in a parent with threads)."""
    import ctypes
    import signal

    parent = os.environ.pop(PARENT_ENV, "")
    if not parent.isdigit():
        return
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return  # not Linux: the parent's own stop() still ends it
    if os.getppid() != int(parent):  # it died before the line above
        os.kill(os.getpid(), signal.SIGTERM)


def stop(proc: subprocess.Popen) -> None:
    """Terminate, and kill what does not exit within 10 s."""
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@contextmanager
def proxy_process(workdir: Path, backend: str, model_dir: Path, *extra: str) -> Iterator[ProxyProcess]:
    proc, handle = start_proxy(workdir, backend, model_dir, *extra)
    try:
        yield handle
    finally:
        stop(proc)
