"""Everything the TRL example needs on one machine, started and stopped together: a private Redis (broker and
sessions), the reference server (`polar serve`) and one rollout worker node (`celery -A workers worker`, which
starts its own proxy). All on 127.0.0.1."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class LocalCluster:
    broker: str
    sessions: str
    engine: str  # the reference server's base URL
    root: Path  # services' logs and the batches' output root


def worker_env(c: LocalCluster, model: Path, name: str = "trl") -> dict[str, str]:
    return {**os.environ, "POLAR_BROKER": c.broker, "POLAR_SESSIONS": c.sessions, "POLAR_ENGINE_URL": c.engine,
            "POLAR_MODEL_DIR": str(model), "POLAR_RUNTIME": os.environ.get("POLAR_RUNTIME", "bwrap"),
            "POLAR_OUTPUT_ROOT": str(c.root), "POLAR_NODE": name, "POLAR_CONFDIR": str(c.root / "confdir"),
            "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


@contextmanager
def worker_node(env: dict[str, str], log: Path, concurrency: int, timeout_s: float = 300.0) -> Iterator[None]:
    cmd = [sys.executable, "-m", "celery", "-A", "workers", "worker", "-n", f"{env['POLAR_NODE']}@%h",
           "-c", str(concurrency), "-P", "prefork", "--loglevel", "INFO", "--without-gossip", "--without-mingle"]
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        deadline = time.monotonic() + timeout_s
        while " ready." not in log.read_text(errors="replace"):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"worker node did not start: {log}\n{log.read_text(errors='replace')[-2000:]}")
            time.sleep(0.2)
        yield
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)  # warm shutdown: the node stops its proxy
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)


@contextmanager
def local_cluster(root: Path, model: Path, concurrency: int = 2) -> Iterator[LocalCluster]:
    from polar.run.local_redis import private_redis
    from polar.run.services import reference_server

    root.mkdir(parents=True, exist_ok=True)
    with ExitStack() as stack:
        redis_url = stack.enter_context(private_redis(root, tcp=True)).rsplit("/", 1)[0]
        engine = stack.enter_context(reference_server(model, None, root / "serve.log"))
        cluster = LocalCluster(f"{redis_url}/1", f"{redis_url}/0", engine, root)
        stack.enter_context(worker_node(worker_env(cluster, model), root / "worker.log", concurrency))
        yield cluster
