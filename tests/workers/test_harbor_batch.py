"""A folder of Harbor tasks through the workers (issue 31): `polar submit fixtures/harbor --group-size 2 --wait` on
one real `celery -A workers worker` node (bubblewrap, the tasks' default image), Pi sessions against the reference
server scripted by fixtures/policies/harbor.yaml. Every sample scores 1 from its task's tests/test.sh, and the
rows of count-lines carry its reward.json's named rewards: a scored Parquet table with no conversion step. A
multi-step task (issue 43) goes through the workers' separate stages the same way: both steps run, rows carry
their step."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from polar.run.services import context_view
from tests.polar.sandbox.test_egress import stand_in_host
from tests.workers.cluster import node_env, spawn_node, wait_ready
from tests.workers.test_rollouts import Cluster

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
HARBOR = ROOT / "fixtures" / "harbor"


EXPECTED = b"hello\n"  # what the stand-in package host serves the verifier of an internet task


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, tiny_model_dir: Path, start_reference_server: Callable[..., str],
            redis_base: str) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("harbor-batch")
    model = context_view(tiny_model_dir, 65536, root / "model")
    engine = start_reference_server(ROOT / "fixtures" / "policies" / "harbor.yaml", model)
    broker, sessions = redis_base + "/6", redis_base + "/5"
    with stand_in_host(lambda path, _host: EXPECTED if path == "/expected" else None) as (port, _asked):
        # the node's operator lists the stand-in for the verifiers of tasks that ask for the internet
        env = node_env(broker, sessions, engine, model, root, "h1", runtime="auto",
                       POLAR_VERIFIER_HOSTS=f"mirror.polar.test=127.0.0.1:{port}")
        node = spawn_node(env, 2)
        try:
            wait_ready(node)
            yield Cluster(root, broker, sessions, engine, None, model, [node])
        finally:
            node.stop()


def submit(cluster: Cluster, tasks: Path, *extra: str, group_size: int = 2) -> tuple[Any, str]:
    """`polar submit TASKS --group-size 2 --adapter pi --wait` to the cluster: the batch, and what it printed."""
    cli = subprocess.run([sys.executable, "-m", "polar.cli", "submit", str(tasks), "--group-size", str(group_size),
                          "--adapter", "pi", "--wait", "--timeout", "600", "--out", str(cluster.root / "batches"),
                          "--broker", cluster.broker, "--sessions", cluster.sessions, *extra],
                         cwd=ROOT, capture_output=True, text=True, timeout=700)
    printed = cli.stdout + cli.stderr
    assert cli.returncode == 0, printed
    return cluster.client.batch(cli.stdout.split()[1].rstrip(":")), printed


def test_a_folder_of_harbor_tasks_is_a_scored_table(cluster: Cluster) -> None:
    batch, printed = submit(cluster, HARBOR)
    assert "reward mean per task: count-lines 1.00 (n=2), fix-mul 1.00 (n=2), write-hello 1.00 (n=2)" in printed
    results = batch.results()
    assert sorted(r["task_id"] for r in results) == ["count-lines"] * 2 + ["fix-mul"] * 2 + ["write-hello"] * 2
    for r in results:
        assert (r["status"], r["failure"], r["reward"], r["runtime"]) == ("completed", None, 1.0, "bwrap"), r
    df = batch.trajectories()
    assert len(df) >= 6 and (df.reward == 1.0).all() and (df.weight == 1.0).all()
    for _, row in df.iterrows():
        task = json.loads(row.metadata)["task"]
        named = {"reward": 1.0, "exact": 1.0} if row.task_id == "count-lines" else None
        assert task.get("rewards") == named, task


def test_a_multi_step_task_through_the_workers(cluster: Cluster) -> None:
    tasks = cluster.root / "steps-tasks"
    shutil.copytree(ROOT / "fixtures" / "harbor-steps" / "name-then-greet", tasks / "name-then-greet")
    batch, printed = submit(cluster, tasks)
    results = batch.results()
    assert len(results) == 2, printed
    for r in results:
        assert (r["status"], r["failure"], r["reward"]) == ("completed", None, 1.0), r
        assert [(s["name"], s["reward"]) for s in r["steps"]] == [("write-name", 1.0), ("greet", 1.0)], r
    df = batch.trajectories()
    steps = {json.loads(m)["task"]["step"] for m in df.metadata}
    assert steps == {"write-name", "greet"} and (df.reward == 1.0).all() and (df.weight == 1.0).all()


FETCHING_TEST = """#!/bin/bash
# the expected answer comes from a package host, as terminal-bench verifiers fetch their tools
python3 - > /tmp/expected <<'PY' || exit 0
import urllib.request
print(urllib.request.urlopen("http://mirror.polar.test/expected", timeout=20).read().decode(), end="")
PY
cmp -s /tmp/expected hello.txt && echo 1 > /logs/verifier/reward.txt
"""


def test_an_internet_task_gets_the_nodes_egress_in_its_verifier_only(cluster: Cluster) -> None:
    """A task that asks for the internet is queued (refused before issue 66); its verifier fetches from the host
    the node's POLAR_VERIFIER_HOSTS lists (reward 1, the request in the sample's egress.jsonl); the same batch with
    --run-offline scores 0 (its verifier reaches nothing)."""
    tasks = cluster.root / "online-tasks"
    shutil.copytree(HARBOR / "write-hello", tasks / "write-hello")
    toml = tasks / "write-hello" / "task.toml"
    toml.write_text(toml.read_text().replace("cpus = 1", "cpus = 1\nallow_internet = true"))
    (tasks / "write-hello" / "tests" / "test.sh").write_text(FETCHING_TEST)
    rewards = {}
    for label, extra in (("online", ()), ("offline", ("--run-offline",))):
        batch, printed = submit(cluster, tasks, *extra, group_size=1)
        (result,) = batch.results()
        assert (result["status"], result["failure"]) == ("completed", None), printed
        rewards[label] = result["reward"]
        logs = list(batch.dir.rglob("egress.jsonl"))
        requests = [json.loads(line) for f in logs for line in f.read_text().splitlines()]
        assert [(r["host"], r["allowed"]) for r in requests] == ([("mirror.polar.test", True)] if label == "online"
                                                                else []), (label, requests)
    assert rewards == {"online": 1.0, "offline": 0.0}
