"""The workers with POLAR_RUNTIME=docker (issue 29): one real `celery -A workers worker` node whose samples run in
podman containers of the demo image by its tag (polar-tasks:local), Pi sessions against the reference server
(tests/workers/rollout_policy.yaml: "Wait SLOW" is one 6 s tool call, reward 1). A batch completes with every
reward 1 in the docker runtime, and a pool process SIGKILLed while its harness runs is redelivered; no container
of the batch is left either way."""
from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Callable, Iterator

import pytest

from polar.run.services import context_view
from tests.polar.sandbox.test_docker import require_engine
from tests.workers.cluster import node_env, spawn_node, wait_ready
from tests.workers.test_rollouts import Cluster, sample_records, wait_for

pytestmark = pytest.mark.slow

HERE = Path(__file__).parent
IMAGE = "polar-tasks:local"  # scripts/setup_podman.sh imports the demo image under this tag


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, tiny_model_dir: Path, start_reference_server: Callable[..., str],
            redis_base: str) -> Iterator[Cluster]:
    engine_cli = require_engine()
    if engine_cli.run(["image", "inspect", IMAGE], check=False).returncode != 0:
        pytest.fail(f"no image {IMAGE} in {engine_cli.kind} (make setup imports it: scripts/setup_podman.sh)")
    root = tmp_path_factory.mktemp("docker-batch")
    model = context_view(tiny_model_dir, 65536, root / "model")
    engine = start_reference_server(HERE / "rollout_policy.yaml", model)
    broker, sessions = redis_base + "/3", redis_base + "/2"
    node = spawn_node(node_env(broker, sessions, engine, model, root, "d1", runtime="docker"), 2)
    try:
        wait_ready(node)
        yield Cluster(root, broker, sessions, engine, None, model, [node])
    finally:
        node.stop()


def containers_of(batch) -> list[str]:
    """Polar's containers whose HOME is under this batch's folder."""
    engine = require_engine()
    ids = engine.run(["ps", "-a", "-q", "--filter", "label=polar.sandbox"]).stdout.split()
    if not ids:
        return []
    homes = engine.run(["inspect", "--format", '{{index .Config.Labels "polar.home"}}', *ids]).stdout.split()
    return [h for h in homes if h.startswith(str(batch.dir))]


def test_a_batch_runs_in_containers(cluster: Cluster) -> None:
    batch = cluster.submit(("slow-d", "slow"), group_size=2, image=IMAGE)
    try:
        p = batch.wait(timeout=600)
    except TimeoutError:
        pytest.fail(cluster.diagnose(batch))
    assert (p.status, p.done, p.masked) == ("completed", 2, 0), cluster.diagnose(batch)
    for result in batch.results():
        assert (result["status"], result["reward"], result["runtime"]) == ("completed", 1.0, "docker"), result
    df = batch.trajectories()
    assert len(df) >= 2 and (df.reward == 1.0).all() and (df.weight == 1.0).all()
    assert containers_of(batch) == []


def test_a_pool_process_killed_mid_run_leaves_no_container(cluster: Cluster) -> None:
    batch = cluster.submit(("slow-k", "slow"), group_size=1, image=IMAGE)
    sid = batch.manifest.samples[0].sample_id
    wait_for(lambda: batch.samples()[sid].get("stage") == "run" and sample_records(cluster, sid), 300,
             "the first call of the slow sample")
    assert len(containers_of(batch)) == 1  # the harness's container, running
    node = cluster.nodes["d1"]
    busy = [pid for pid in node.pool_pids() if _children(pid)]  # the one whose `exec` client runs the harness
    assert len(busy) == 1, busy
    os.kill(busy[0], signal.SIGKILL)  # the node respawns it; the task is redelivered
    try:
        p = batch.wait(timeout=600)
    except TimeoutError:
        pytest.fail(cluster.diagnose(batch))
    assert (p.status, p.done) == ("completed", 1), cluster.diagnose(batch)
    result = batch.results()[0]
    assert (result["status"], result["reward"], result["attempts"]) == ("completed", 1.0, 2), result
    assert containers_of(batch) == []  # the abandoned attempt's container too


def _children(pid: int) -> list[str]:
    """The pids of a process's children (of its main thread)."""
    try:
        return Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return []
