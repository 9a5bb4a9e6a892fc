"""Fixtures shared by the whole suite: the tiny fixture model and the real reference server on 127.0.0.1."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path
from types import ModuleType
from typing import Callable, Iterator

import pytest

from polar_serve.forkserver import ENV_VAR as FORKSERVER_ENV
from polar_serve.launch import reference_server as launch_reference_server

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach the hub from tests

ROOT = Path(__file__).resolve().parents[1]
_forkserver: subprocess.Popen[str] | None = None


def pytest_configure(config: pytest.Config) -> None:
    """One warm fork server for the run's reference servers (the controller's; xdist workers and every CLI a
    test starts inherit POLAR_SERVE_FORKSERVER): each start then costs a fork, not ~3.5 CPU-s of imports."""
    global _forkserver
    if hasattr(config, "workerinput") or os.environ.get(FORKSERVER_ENV) or os.environ.get("POLAR_NO_FORKSERVER"):
        return
    path = Path(tempfile.mkdtemp(prefix="polar-forkserver-")) / "socket"
    _forkserver = subprocess.Popen([sys.executable, "-m", "polar_serve.forkserver", "--socket", str(path)],
                                   stdout=subprocess.PIPE, text=True)
    assert _forkserver.stdout is not None
    if _forkserver.stdout.readline().startswith("polar serve forkserver: listening"):
        os.environ[FORKSERVER_ENV] = str(path)  # else every server starts as a process, as without it


def pytest_unconfigure(config: pytest.Config) -> None:
    if _forkserver is not None:
        _forkserver.terminate()
        _forkserver.wait(30)
        path = os.environ.pop(FORKSERVER_ENV, None)
        if path:
            Path(path).parent.rmdir()  # the fork server removed its socket


@pytest.fixture(scope="session")
def tiny_model_dir() -> Path:
    """fixtures/tiny-qwen2: byte-level BPE (vocab 1024), ChatML+tools template, random 2-layer Qwen2."""
    return ROOT / "fixtures" / "tiny-qwen2"


@pytest.fixture(scope="session")
def policies_dir() -> Path:
    return ROOT / "fixtures" / "policies"


@pytest.fixture(scope="session")
def start_reference_server(tiny_model_dir: Path) -> Iterator[Callable[..., str]]:
    """start_reference_server(policy=None, model_dir=tiny, *extra_args, timeout=120) -> base URL. One process per
    distinct argument set for the whole session; all are stopped at the end. `timeout`: for its ready line."""
    servers: dict[tuple, str] = {}
    with ExitStack() as stack:
        def start(policy: str | Path | None = None, model_dir: str | Path | None = None, *extra_args: str,
                  timeout: float = 120.0) -> str:
            key = (str(policy) if policy else None, str(model_dir or tiny_model_dir), extra_args)
            if key not in servers:
                servers[key] = stack.enter_context(
                    launch_reference_server(model_dir or tiny_model_dir, policy, tuple(extra_args), timeout))
            return servers[key]

        yield start


@pytest.fixture(scope="session")
def reference_server(start_reference_server: Callable[..., str]) -> str:
    """Base URL (http://127.0.0.1:PORT) of the reference server on the tiny model, no scripted policy."""
    return start_reference_server()


@pytest.fixture(scope="session")
def make_tiny_model() -> ModuleType:
    """scripts/make_tiny_model.py as a module (it is a script, not a package)."""
    spec = importlib.util.spec_from_file_location("make_tiny_model", ROOT / "scripts" / "make_tiny_model.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module
