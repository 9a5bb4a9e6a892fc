"""Everything the TRL example needs on one machine, started and stopped together: a private Redis (broker and
sessions), the reference server (`polar serve`) and one rollout worker node (`celery -A workers worker`, which
starts its own proxy). All on 127.0.0.1."""
from __future__ import annotations

import os
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
def local_cluster(root: Path, model: Path, concurrency: int = 2) -> Iterator[LocalCluster]:
    from polar.run.local_redis import private_redis
    from polar.run.services import reference_server, worker_node

    root.mkdir(parents=True, exist_ok=True)
    with ExitStack() as stack:
        redis_url = stack.enter_context(private_redis(root, tcp=True)).rsplit("/", 1)[0]
        engine = stack.enter_context(reference_server(model, None, root / "serve.log"))
        cluster = LocalCluster(f"{redis_url}/1", f"{redis_url}/0", engine, root)
        stack.enter_context(worker_node(worker_env(cluster, model), root / "worker.log", concurrency, ROOT))
        yield cluster
