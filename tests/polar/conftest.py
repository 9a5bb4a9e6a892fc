"""Fixtures for polar/ (adapters, runner, runtimes): a long-context view of the tiny model, a private Redis on a
unix socket (registered sessions for a shared proxy), and the harness CLIs' directory."""
from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path
from typing import Iterator

import pytest

from polar.run.session import TOOLS_BIN
from polar.run.services import context_view

ROOT = Path(__file__).resolve().parents[2]
# Harness prompts are 3k-36k tokens of the tiny model's byte-level BPE; its config says 4096.
CONTEXT_LENGTH = 65536


@pytest.fixture(scope="session")
def long_model(tmp_path_factory, tiny_model_dir: Path) -> Path:
    """fixtures/tiny-qwen2 with max_position_embeddings raised (same files, symlinked)."""
    return context_view(tiny_model_dir, CONTEXT_LENGTH, tmp_path_factory.mktemp("model"))


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory) -> Iterator[str]:
    """A private redis-server on a unix socket only (reachable from any network namespace)."""
    server = shutil.which("redis-server")
    if server is None:
        pytest.fail("redis-server is not installed (make setup installs it)")
    tmp = tmp_path_factory.mktemp("redis")
    sock = tmp / "redis.sock"
    proc = subprocess.Popen([server, "--port", "0", "--unixsocket", str(sock), "--unixsocketperm", "700",
                             "--save", "", "--appendonly", "no", "--dir", str(tmp)],
                            stdout=open(tmp / "redis.log", "wb"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 20
    while not sock.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"redis-server did not start: {(tmp / 'redis.log').read_text()[-2000:]}")
        time.sleep(0.05)
    yield f"unix://{sock}"
    proc.terminate()
    proc.wait(10)


@pytest.fixture(scope="session")
def tools_bin() -> Path:
    return TOOLS_BIN
