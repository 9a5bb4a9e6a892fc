"""A real mitmdump process running Polar's addon, in front of the real reference server."""
from __future__ import annotations

import os
import socket
import threading
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from polar_mitm.sessions.registry import hashed_id

from polar_mitm import launch
from polar_mitm.launch import free_port, stop  # noqa: F401  (tests import both from here)
from polar_traj.capture_reader import read_capture_dicts


@dataclass
class Proxy:
    """A started proxy plus the helpers tests use on it."""

    process: launch.ProxyProcess

    def __getattr__(self, name):
        return getattr(self.process, name)

    def proxy_url(self, session: str = "sess", token: str = "tok") -> str:
        return self.process.proxy_url(session, token)

    def records(self, session: str, task: str = "local") -> list[dict]:
        """A session's records, by its name (proxy user or session header) or by the API key that named it
        (open mode stores a key only as its hash)."""
        path = self.process.capture_dir / task / f"{session}.jsonl"
        if not path.exists():
            path = self.process.capture_dir / task / f"{hashed_id(session)}.jsonl"
        if not path.exists():
            return []
        return list(read_capture_dicts(path))

    def proxied_client(self, session: str = "sess", token: str = "tok") -> httpx.Client:
        return httpx.Client(proxy=self.proxy_url(session, token), verify=str(self.process.ca_cert), timeout=60)


def start_proxy(tmp: Path, backend: str, model_dir: Path, *extra: str, **kwargs):
    proc, handle = launch.start_proxy(tmp, backend, model_dir, *extra, **kwargs)
    return proc, Proxy(handle)


@pytest.fixture(scope="session")
def proxy(tmp_path_factory, reference_server, tiny_model_dir):
    proc, handle = start_proxy(tmp_path_factory.mktemp("proxy"), reference_server, tiny_model_dir)
    yield handle
    stop(proc)


class CountingListener:
    """A TCP listener on a loopback address (127.0.0.1 unless told) that only counts connections: proof that
    nothing reached it."""

    def __init__(self, port: int = 0, host: str = "127.0.0.1") -> None:
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, port))
        self.sock.listen()
        self.host = host
        self.port = self.sock.getsockname()[1]
        self.peers: list[tuple[str, int]] = []  # in the order accepted
        self.seen = threading.Condition()
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        while True:
            try:
                conn, peer = self.sock.accept()
            except OSError:
                return
            with self.seen:
                self.peers.append(peer)
                self.seen.notify_all()
            conn.close()

    def accepted_before_now(self, timeout_s: float = 30.0) -> int:
        """Connections that arrived before this call. Connects once itself and waits until the accept thread
        took that connection: the kernel hands connections over in arrival order, so all earlier ones are counted."""
        with socket.create_connection((self.host, self.port)) as probe:
            me = probe.getsockname()
            with self.seen:
                assert self.seen.wait_for(lambda: me in self.peers, timeout_s), "the listener never accepted"
                return self.peers.index(me)


PROVIDER_HOSTS = ("api.openai.com", "api.anthropic.com", "generativelanguage.googleapis.com",
                  "dashscope.aliyuncs.com", "dashscope-intl.aliyuncs.com")
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="binds port 443 and mounts a private /etc/hosts")


def worker_loopback() -> str:
    """A loopback address of this test process's own: pytest-xdist workers share one network namespace, and
    each binds port 443 (127.0.0.2 for gw0, 127.0.0.3 for gw1, …; 127.0.0.1 without xdist)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    return f"127.0.0.{2 + int(worker[2:])}" if worker.startswith("gw") else "127.0.0.1"


@pytest.fixture(scope="session")
def provider_host(tmp_path_factory):
    """A listener on port 443 of a loopback address and an /etc/hosts that sends every provider hostname to it:
    what a leak to a real provider would reach (the suite runs in a loopback-only network namespace)."""
    listener = CountingListener(443, worker_loopback())
    hosts = tmp_path_factory.mktemp("hosts") / "hosts"
    hosts.write_text("127.0.0.1 localhost\n" + "".join(f"{listener.host} {h}\n" for h in PROVIDER_HOSTS))
    yield listener, hosts
    listener.sock.close()
