"""A real mitmdump process running Polar's addon, in front of the real reference server."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from polar_mitm.sessions import hashed_id

from polar_mitm import launch
from polar_mitm.launch import free_port, stop  # noqa: F401  (free_port: tests import it from here)


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
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def proxied_client(self, session: str = "sess", token: str = "tok") -> httpx.Client:
        return httpx.Client(proxy=self.proxy_url(session, token), verify=str(self.process.ca), timeout=60)


def start_proxy(tmp: Path, backend: str, model_dir: Path, *extra: str, **kwargs):
    proc, handle = launch.start_proxy(tmp, backend, model_dir, *extra, **kwargs)
    return proc, Proxy(handle)


@pytest.fixture(scope="session")
def proxy(tmp_path_factory, reference_server, tiny_model_dir):
    proc, handle = start_proxy(tmp_path_factory.mktemp("proxy"), reference_server, tiny_model_dir)
    yield handle
    stop(proc)
