"""A real mitmdump process running Polar's addon, in front of the real reference server."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]
MITMDUMP = Path(sys.executable).parent / "mitmdump"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(port: int, proc: subprocess.Popen, log: Path, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port} after {timeout}s:\n{log.read_text()[-3000:]}")


@dataclass
class Proxy:
    proxy_port: int
    base_port: int
    ca: Path
    capture_dir: Path
    backend: str
    log: Path

    def proxy_url(self, session: str = "sess", token: str = "tok") -> str:
        return f"http://{session}:{token}@127.0.0.1:{self.proxy_port}"

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.base_port}"

    def records(self, session: str, task: str = "local") -> list[dict]:
        path = self.capture_dir / task / f"{session}.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def proxied_client(self, session: str = "sess", token: str = "tok") -> httpx.Client:
        return httpx.Client(proxy=self.proxy_url(session, token), verify=str(self.ca), timeout=60)


def start_proxy(tmp: Path, backend: str, model_dir: Path, *extra: str) -> tuple[subprocess.Popen, Proxy]:
    p1, p2 = free_port(), free_port()
    confdir, capture, log = tmp / "mitm", tmp / "captures", tmp / "mitmdump.log"
    cmd = [
        str(MITMDUMP), "-q", "-s", str(ROOT / "polar_mitm" / "addon.py"),
        "--mode", f"regular@127.0.0.1:{p1}", "--mode", f"reverse:{backend}@127.0.0.1:{p2}",
        "--set", f"confdir={confdir}", "--set", "connection_strategy=lazy",
        "--set", f"polar_backend={backend}", "--set", f"polar_tokenizer={model_dir}",
        "--set", f"polar_capture_dir={capture}", *extra,
    ]
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    proc = subprocess.Popen(cmd, stdout=open(log, "wb"), stderr=subprocess.STDOUT, env=env, cwd=tmp)
    wait_for_port(p1, proc, log)
    wait_for_port(p2, proc, log)
    return proc, Proxy(p1, p2, confdir / "mitmproxy-ca-cert.pem", capture, backend, log)


@pytest.fixture(scope="session")
def proxy(tmp_path_factory, reference_server, tiny_model_dir):
    proc, handle = start_proxy(tmp_path_factory.mktemp("proxy"), reference_server, tiny_model_dir)
    yield handle
    proc.terminate()
    proc.wait(10)
