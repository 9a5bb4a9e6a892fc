"""The rollout service end to end: real Redis, two real `celery -A workers worker` processes as two nodes (each
with its own proxy), the real reference server behind a request log, real Pi sessions in bubblewrap sandboxes,
the evaluator deciding rewards (tests/workers/rollout_policy.yaml: a coin the agent flips with a shell line).

Batches: three tasks x group size 4 over both nodes; a worker process SIGKILLed mid-run; cancel; early stop;
the weight-sync fence with a weight reload; an unreachable image (retried, then masked)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Iterator

from dataclasses import asdict

import httpx
import pandas as pd
import pytest
import yaml

from polar import PolarClient
from polar.run.services import context_view
from polar_mitm.launch import free_port
from polar_traj.reading import SessionFile, read_session
from tests.prompt_oracle import assert_prompt_faithful
from tests.workers.cluster import Node, node_env, spawn_node, wait_ready
from tests.workers.engine_log import EngineLog, start_engine_log

pytestmark = pytest.mark.slow

HERE = Path(__file__).parent
ROOT = HERE.parents[1]
DEMO_TASKS = ROOT / "fixtures" / "tasks" / "tasks.yaml"  # three repos with a failing test, in the tasks image
TASKS = {
    "coin": {"instruction": "Flip the coin.", "evaluator": {"command": "grep -qx heads coin.txt", "timeout_s": 30},
             "submit": ["coin.txt"]},  # the new files the agent's work may add (docs/tasks.md "submit")
    "slow": {"instruction": "Wait SLOW.", "evaluator": {"command": "test -f waited.txt", "timeout_s": 30},
             "submit": ["waited.txt"]},
    "long": {"instruction": "Wait LONG.", "evaluator": {"command": "true", "timeout_s": 30}, "submit": []},
    "count": {"instruction": "Count to three.",
              "evaluator": {"command": "test $(wc -l < count.txt) -eq 3", "timeout_s": 30}, "submit": ["count.txt"]},
    "exit127": {"instruction": "Break the verifier.", "submit": ["answer.py"],
                # the scorer imports the agent's answer.py, which exits 127
                # prints 0 first: on the untouched workspace (no answer.py) that is its reward (polar/scoring/precheck.py)
                "evaluator": {"command": "python3 -I -c 'import sys; print(0); sys.path.insert(0, \".\"); import answer'",
                              "reward": "stdout", "timeout_s": 30}},
}


class Cluster:
    def __init__(self, root: Path, broker: str, sessions: str, engine: str, log: EngineLog, model: Path,
                 nodes: list[Node]) -> None:
        self.root, self.broker, self.sessions, self.engine, self.log, self.model = (root, broker, sessions, engine,
                                                                                    log, model)
        self.nodes = {n.name: n for n in nodes}
        self.client = PolarClient(broker, sessions)
        self.count = 0

    def tasks_file(self, *tasks: tuple[str, str], image: str = "host") -> Path:
        """A tasks file: (task_id, kind) pairs, Pi, the host image (bwrap runtime)."""
        self.count += 1
        path = self.root / f"tasks-{self.count}.yaml"
        entries = [{"task_id": tid, "adapter": "pi", "image": image, "timeout_s": 240, **TASKS[kind]}
                   for tid, kind in tasks]
        path.write_text(yaml.safe_dump({"tasks": entries}))
        return path

    def submit(self, *tasks: tuple[str, str], image: str = "host", **kwargs):
        return self.client.submit(self.tasks_file(*tasks, image=image), out=self.root / "batches", **kwargs)

    def diagnose(self, batch) -> str:
        logs = "\n".join(f"--- {n.name}\n{n.log.read_text(errors='replace')[-4000:]}" for n in self.nodes.values())
        return f"{batch.progress().line()}\n{json.dumps(batch.samples(), indent=1)}\n{logs}"


def combined_policy(path: Path) -> Path:
    """The tests' rules, then the demo tasks' stochastic fixing policy (fix-bug-sometimes: each sample fixes
    the bug or gives up, by a draw seeded per session), without its catch-all rule."""
    ours = yaml.safe_load((HERE / "rollout_policy.yaml").read_text())["rules"]
    fixing = yaml.safe_load((ROOT / "fixtures" / "policies" / "fix-bug-sometimes.yaml").read_text())["rules"]
    path.write_text(yaml.safe_dump({"rules": ours + [r for r in fixing if r["name"].startswith("fix-")]}))
    return path


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, tiny_model_dir: Path, start_reference_server: Callable[..., str],
            redis_base: str) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("rollouts")
    model = context_view(tiny_model_dir, 65536, root / "model")
    engine = start_reference_server(combined_policy(root / "policy.yaml"), model)
    log, stop_log = start_engine_log(engine)
    broker, sessions = redis_base + "/1", redis_base + "/0"
    nodes = []
    try:
        for name in ("n1", "n2"):
            nodes.append(spawn_node(node_env(broker, sessions, log.url, model, root, name, runtime="auto",
                                             POLAR_STATUS_S="2")))
        for n in nodes:
            wait_ready(n)
        yield Cluster(root, broker, sessions, engine, log, model, nodes)
    finally:
        for n in nodes:
            n.stop()
        stop_log()


def wait_for(predicate: Callable[[], object], timeout_s: float, what: str) -> object:
    deadline = time.monotonic() + timeout_s
    while not (value := predicate()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)
    return value


def records(folder: Path, pattern: str = "*.jsonl", skip: str | None = None) -> list[dict]:
    """CallRecords (as dicts, payloads included) in the capture files under `folder`, each call once, leaving
    out paths containing `skip`; read with polar_traj's reader (either capture format)."""
    found: dict[str, dict] = {}
    for f in sorted(folder.rglob(pattern)):
        if skip is None or skip not in str(f):
            session = read_session(SessionFile(f.parent.name, f.name[:-len(".jsonl")], f), payloads=True,
                                   strict=False)
            for record in session.records:
                found.setdefault(record.call_id, asdict(record))
    return list(found.values())


def sample_records(cluster: Cluster, sample_id: str) -> list[dict]:
    """CallRecords of a sample's live session, on whichever node's proxy it ran."""
    return [r for n in cluster.nodes for r in records(cluster.root / "nodes" / n / "captures", f"*{sample_id}*")]


def sandbox_processes(path: Path) -> list[str]:
    """Processes whose command line names `path` (a bwrap sandbox binds its attempt folder)."""
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if str(path) in cmd:
                found.append(f"{proc.name}: {cmd[:200]}")
    return found


def test_a_node_says_it_is_up_and_how_it_is(cluster: Cluster):
    """One Polar line at start (queues, proxy ports and log, each engine's state, runtime), then a status line
    every POLAR_STATUS_S: a node whose engine is down says so before its first sample fails."""
    log = cluster.root / "nodes" / "n1" / "worker.log"
    up = next(line for line in log.read_text().splitlines() if line.startswith("polar node n1: up;"))
    assert "queues n1.postrun, n1.run, postrun, prepare;" in up
    assert f"log {cluster.root / 'nodes' / 'n1' / 'proxy.log'}" in up
    assert f"engines (sglang): {cluster.log.url} up (model {cluster.model.name});" in up
    assert "runtime auto (bwrap for tasks without an image; docker or apptainer for a task's image)" in up
    wait_for(lambda: any(line.startswith("polar node n1: alive, ") and "samples held" in line
                         for line in log.read_text().splitlines()), 30, "a status line")


def test_a_node_that_cannot_serve_refuses_to_start_and_the_batch_finishes_elsewhere(cluster: Cluster):
    """POLAR_MODEL_DIR=/nonexistent: the worker says so in one line and exits 1 before its consumer starts (it
    once took samples from the shared queue and failed them, `this worker's proxy is not running`, and a batch
    waited on them forever); a batch submitted meanwhile finishes on the good nodes."""
    env = node_env(cluster.broker, cluster.sessions, cluster.log.url, Path("/nonexistent"), cluster.root, "bad",
                   runtime="auto")
    bad = spawn_node(env)
    batch = cluster.submit(("count-refused", "count"), group_size=2)
    try:
        assert bad.proc.wait(60) == 1
    finally:
        bad.stop()
    lines = [line for line in bad.log.read_text().splitlines() if line.startswith("polar node bad")]
    assert lines == ["polar node bad: refused to start: POLAR_MODEL_DIR /nonexistent: no such file or directory"]
    assert "Traceback" not in bad.log.read_text() and " ready." not in bad.log.read_text()
    assert "bad" not in {n.node for n in cluster.client.nodes()}
    try:
        p = batch.wait(timeout=300)
    except TimeoutError:
        pytest.fail(cluster.diagnose(batch))
    assert (p.status, p.done, p.masked) == ("completed", 2, 0) and set(p.nodes) <= {"n1", "n2"}, cluster.diagnose(batch)


def test_a_node_whose_broker_does_not_answer_refuses_to_start(cluster: Cluster):
    """POLAR_BROKER on a port where no Redis listens: one line naming it and exit 1 (it once said `up` and then
    retried the connection forever)."""
    port = free_port()
    env = node_env(f"redis://127.0.0.1:{port}/1", cluster.sessions, cluster.log.url, cluster.model, cluster.root,
                   "nobroker", runtime="auto")
    bad = spawn_node(env)
    try:
        assert bad.proc.wait(90) == 1
    finally:
        bad.stop()
    lines = [line for line in bad.log.read_text().splitlines() if line.startswith("polar node nobroker")]
    assert len(lines) == 1 and lines[0].startswith(
        f"polar node nobroker: refused to start: POLAR_BROKER redis://127.0.0.1:{port}/1: not answering ("), lines
    assert "Traceback" not in bad.log.read_text()


def test_batch_of_groups_over_two_nodes(cluster: Cluster, tiny_model_dir: Path):
    """The three demo tasks x group size 4, Pi in the tasks image (Apptainer), the evaluator running their tests."""
    batch = cluster.client.submit(DEMO_TASKS, group_size=4, adapter="pi", out=cluster.root / "batches")
    try:
        p = batch.wait(timeout=1200)
    except TimeoutError:
        pytest.fail(cluster.diagnose(batch))
    assert (p.status, p.done, p.masked, p.groups_done) == ("completed", 12, 0, 3), cluster.diagnose(batch)
    assert set(p.nodes) == {"n1", "n2"}  # samples ran on both nodes
    results = {r["sample_id"]: r for r in batch.results()}
    assert len(results) == 12
    for sid, res in results.items():
        repo = res["task_id"].removeprefix("fix-")
        original = (DEMO_TASKS.parent / repo / f"{repo}.py").read_text()
        fixed = (batch.dir / "samples" / sid / "attempt-1" / "workspace" / f"{repo}.py").read_text() != original
        assert res["status"] == "completed" and res["reward"] == (1.0 if fixed else 0.0), res
        assert (res["engine"], res["model"]) == (f"sglang at {cluster.log.url}", str(cluster.model))
    outcome = json.loads((batch.dir / "outcome.json").read_text())  # the folder alone says how it ended
    assert (outcome["status"], outcome["done"], outcome["total"]) == ("completed", 12, 12)
    df = batch.trajectories()
    assert not df.trajectory_id.duplicated().any()
    assert pd.read_parquet(batch.dir / "trajectories").shape == df.shape  # plain pandas reads the dataset
    for group_id, rows in df.groupby("group_id"):
        members = [s for s in batch.manifest.group(group_id)]
        rewards = {s.sample_id: results[s.sample_id]["reward"] for s in members}
        mean = sum(rewards.values()) / len(rewards)
        for _, row in rows.iterrows():
            sid = json.loads(row.metadata)["sample"]["sample_id"]
            assert row.reward == rewards[sid] and row.advantage == pytest.approx(rewards[sid] - mean)
            assert row.weight == 1.0 and row.status == "completed"
    assert df.session_id.nunique() == 12
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    calls = records(batch.dir / "samples")
    assert {c for ids in df.call_ids for c in ids} <= {r["call_id"] for r in calls}
    for record in calls:
        assert record["error"] is None
        assert_prompt_faithful(record, tokenizer)


def test_worker_killed_mid_run_is_redelivered(cluster: Cluster):
    batch = cluster.submit(("slow-a", "slow"), group_size=1)
    sid = batch.manifest.samples[0].sample_id
    wait_for(lambda: batch.samples()[sid].get("stage") == "run" and sample_records(cluster, sid), 300,
             "the first call of the slow sample")
    first_calls = sample_records(cluster, sid)
    node = cluster.nodes[batch.samples()[sid]["node"]]
    pids = node.pool_pids()
    assert len(pids) == 1
    os.kill(pids[0], signal.SIGKILL)  # the pool process running the harness; the node respawns it
    try:
        p = batch.wait(timeout=600)
    except TimeoutError:
        pytest.fail(cluster.diagnose(batch))
    assert (p.status, p.done) == ("completed", 1), cluster.diagnose(batch)
    result = batch.results()[0]
    assert (result["status"], result["reward"], result["attempts"]) == ("completed", 1.0, 2)
    first = batch.dir / "samples" / sid / "attempt-1"
    assert json.loads((first / "ABANDONED.json").read_text())["kind"] == "worker_lost"
    kept = records(first / "abandoned-captures")
    assert [r["call_id"] for r in kept][:len(first_calls)] == [r["call_id"] for r in first_calls]  # none lost
    df = batch.trajectories()
    assert len(df) >= 1 and not df.trajectory_id.duplicated().any()
    trained = {c for ids in df.call_ids for c in ids}
    assert trained and not trained & {r["call_id"] for r in kept}  # the abandoned attempt is not trained on


def test_cancel_stops_running_and_queued(cluster: Cluster):
    batch = cluster.submit(("long-a", "long"), group_size=4)
    ids = [s.sample_id for s in batch.manifest.samples]
    running = wait_for(lambda: [s for s in ids if batch.samples()[s].get("stage") == "run"
                                and sample_records(cluster, s)] if sum(
        1 for s in ids if batch.samples()[s].get("stage") == "run" and sample_records(cluster, s)) == 2 else None,
        300, "two harnesses running")
    queued = [s for s in ids if batch.samples()[s].get("stage") == "queued"]
    assert len(queued) == 2  # one run slot per node: the other two wait in the queue
    assert batch.cancel()
    try:
        p = batch.wait(timeout=300)
    except TimeoutError:
        pytest.fail(cluster.diagnose(batch))
    assert (p.status, p.cancelled) == ("cancelled", 4)
    assert json.loads((batch.dir / "outcome.json").read_text())["status"] == "cancelled"
    from polar.report.data import load
    from polar.report.sections import status

    assert "4 cancelled (never finished: the batch ended cancelled)" in status(load(batch.dir))
    for s in queued:
        assert not (batch.dir / "samples" / s).exists()  # never started
    for s in running:
        attempt = batch.dir / "samples" / s / "attempt-1"
        assert wait_for(lambda: not sandbox_processes(attempt), 60, f"sandbox of {s} gone")
    assert not batch.cancel()  # already finished


def test_per_request_batch_has_a_row_per_call(cluster: Cluster):
    """strategy per_request (a trainer that wants one row per LLM call): four calls of "Count to three" give four
    rows, each the call's own prompt and sampled tokens, with the group's advantages as prefix_merge rows get."""
    batch = cluster.submit(("count-pr", "count"), group_size=2, strategy="per_request")
    try:
        p = batch.wait(timeout=600)
    except TimeoutError:
        pytest.fail(cluster.diagnose(batch))
    assert (p.status, p.done) == ("completed", 2), cluster.diagnose(batch)
    df = batch.trajectories()
    assert set(df.strategy) == {"per_request"} and set(df.num_calls) == {1}
    for sample in batch.manifest.samples:
        rows = df[df.session_id == sample.sample_id]
        calls = sample_records(cluster, sample.sample_id)
        assert len(rows) == len(calls) == 4
        by_call = {r["call_id"]: r for r in calls}
        for row in rows.itertuples():
            (call_id,) = row.call_ids
            assert list(row.prompt_ids) == list(by_call[call_id]["prompt_ids"])
            assert list(row.response_ids) == list(by_call[call_id]["output_ids"])
            assert row.weight == 1.0 and row.advantage == 0.0  # both samples scored 1: a group of equals


def test_a_node_with_two_proxies_keeps_each_sample_on_one(cluster: Cluster):
    """POLAR_PROXIES=2: the node starts two proxies and sends each sample's calls through the one its id picks
    (workers.node.for_sample), so every session is whole in one proxy's capture and its later calls are
    substituted from that process's history. n1 and n2 are drained meanwhile, so the batch runs on n3."""
    import zlib

    n3 = wait_ready(spawn_node(node_env(cluster.broker, cluster.sessions, cluster.log.url, cluster.model,
                                        cluster.root, "n3", runtime="auto", POLAR_PROXIES="2"), concurrency=2))
    try:
        for name in ("n1", "n2"):
            cluster.client.drain(name, 600)
        wait_for(lambda: {n.node: n.state for n in cluster.client.nodes()}.get("n2") == "draining"
                 and {n.node: n.state for n in cluster.client.nodes()}.get("n1") == "draining", 30, "n1, n2 draining")
        up = next(line for line in n3.log.read_text().splitlines() if line.startswith("polar node n3: up;"))
        assert up.count("(HTTPS_PROXY)") == 2 and "nodes/n3/captures-1" in up
        batch = cluster.submit(("count-k2", "count"), group_size=4)
        try:
            p = batch.wait(timeout=600)
        except TimeoutError:
            pytest.fail(cluster.diagnose(batch))
        assert (p.status, p.done, set(p.nodes)) == ("completed", 4, {"n3"}), cluster.diagnose(batch)
        dirs = [cluster.root / "nodes" / "n3" / d for d in ("captures", "captures-1")]
        for sample in batch.manifest.samples:
            found = [records(d, f"*{sample.sample_id}*") for d in dirs]
            mine = zlib.crc32(sample.sample_id.encode()) % 2
            assert len(found[mine]) == 4 and not found[1 - mine]  # all four calls in its own proxy's capture
            assert [r["prefix_source"] for r in found[mine]][1:] == ["substituted"] * 3
        # `polar status` shows what the node's proxies hold, and a proxy that stops reporting (killed here)
        status = next(n for n in cluster.client.nodes() if n.node == "n3")
        assert [p["state"] for p in status.proxies] == ["reporting", "reporting"], status
        assert "; 2 proxies: RSS " in status.line(), status.line()
        assert all(p["rss_bytes"] > 20 * 2**20 for p in status.proxies), status
        os.kill(status.proxies[1]["pid"], signal.SIGKILL)
        wait_for(lambda: "proxy 1 not reporting (stale" in next(
            n.line() for n in cluster.client.nodes() if n.node == "n3"), 60, "n3's proxy 1 reported stale")
    finally:
        for name in ("n1", "n2"):
            cluster.client.undrain(name)
        n3.stop()
        wait_for(lambda: all(n.state == "alive" for n in cluster.client.nodes() if n.node in ("n1", "n2")), 30,
                 "n1, n2 alive again")


def test_early_stop_after_min_groups(cluster: Cluster):
    batch = cluster.submit(("coin-x", "coin"), ("long-y", "long"), group_size=2, min_groups=1)
    try:
        p = batch.wait(timeout=600)
    except TimeoutError:
        pytest.fail(cluster.diagnose(batch))
    assert (p.status, p.groups_done, p.done, p.cancelled) == ("completed", 1, 2, 2), cluster.diagnose(batch)
    df = batch.trajectories()
    assert set(df.task_id) == {"coin-x"}
    for s in batch.manifest.group(batch.manifest.groups[1]):
        for attempt in (batch.dir / "samples" / s.sample_id).glob("attempt-*"):
            assert wait_for(lambda: not sandbox_processes(attempt), 60, f"sandbox of {s.sample_id} gone")


def test_unreachable_image_is_retried_then_masked(cluster: Cluster):
    """Submitted with `polar submit --wait`: live progress, then the summary names the masked sample's reason."""
    tasks = cluster.tasks_file(("broken", "coin"), image=str(cluster.root / "no-such-image.sif"))
    cli = subprocess.run([sys.executable, "-m", "polar.cli", "submit", str(tasks), "--group-size", "1", "--wait",
                          "--timeout", "300", "--out", str(cluster.root / "batches"), "--broker", cluster.broker,
                          "--sessions", cluster.sessions], cwd=ROOT, capture_output=True, text=True, timeout=400)
    assert cli.returncode == 1, cli.stdout + cli.stderr  # a masked sample fails `--wait` (--max-masked 0)
    assert "1 of 1 samples masked" in cli.stdout + cli.stderr
    batch = cluster.client.batch(cli.stdout.split()[1].rstrip(":"))
    assert "masked" in cli.stdout and "no-such-image" in cli.stdout  # the final summary
    assert "1/1" in cli.stderr  # tqdm's bar
    p = batch.progress()
    assert (p.status, p.masked, p.groups_done) == ("completed", 1, 1)
    result = batch.results()[0]
    assert (result["status"], result["failure"], result["attempts"]) == ("error", "infrastructure", 3)
    assert "no-such-image" in result["reason"]
    sdir = batch.dir / "samples" / result["sample_id"]
    kinds = [json.loads((sdir / f"attempt-{k}" / "ABANDONED.json").read_text())["kind"] for k in (1, 2)]
    assert kinds == ["infrastructure", "infrastructure"]
    assert batch.progress().reward_mean is None
    df = batch.trajectories()
    assert (df.weight == 0).all()  # whatever it recorded is masked


def test_a_verifier_broken_by_the_workspace_scores_zero_and_is_not_retried(cluster: Cluster):
    """Exit 127 caused by the agent's own file is its failure: reward 0, trainable, one attempt (issue 22)."""
    batch = cluster.submit(("breaker", "exit127"), group_size=1)
    batch.wait(timeout=300)
    result = batch.results()[0]
    assert (result["status"], result["failure"], result["reward"], result["attempts"]) == (
        "completed", None, 0.0, 1), cluster.diagnose(batch)
    df = batch.trajectories()
    assert len(df) and (df.weight == 1).all() and (df.reward == 0).all()


def test_fence_holds_calls_across_a_weight_reload(cluster: Cluster):
    before = httpx.get(cluster.engine + "/get_model_info").json()["weight_version"]
    batch = cluster.submit(("count-a", "count"), group_size=2, max_staleness=0)
    ids = [s.sample_id for s in batch.manifest.samples]
    wait_for(lambda: all(sample_records(cluster, s) for s in ids), 300, "both sessions under way")
    cluster.client.pause(timeout_s=120)
    paused_at = time.time()
    assert cluster.client.is_paused()
    reply = httpx.post(cluster.engine + "/update_weights_from_disk", json={"model_path": str(cluster.model)},
                       timeout=120).json()
    assert reply["success"] and reply["weight_version"] != before
    time.sleep(2.0)  # a window in which the harnesses ask for their next calls
    resumed_at = time.time()
    cluster.client.resume()
    try:
        p = batch.wait(timeout=600)
    except TimeoutError:
        pytest.fail(cluster.diagnose(batch))
    assert (p.status, p.done) == ("completed", 2), cluster.diagnose(batch)  # nothing failed
    assert all(r["reward"] == 1.0 for r in batch.results())
    during = [e for e in cluster.log.generations() if paused_at < e["start"] < resumed_at]
    assert during == []  # no engine call started while paused
    calls = [r for s in ids for r in records(batch.dir / "samples" / s, skip="abandoned-captures")]
    held = [r for r in calls if r["started_at"] < resumed_at < r["ended_at"] and r["started_at"] > paused_at]
    assert held and all(r["error"] is None for r in calls)  # held calls completed after the resume
    versions = {str(r["policy_version"]) for r in calls}
    assert len(versions) == 2 and str(reply["weight_version"]) in versions
    df = batch.trajectories()
    assert df.policy_version_max.max() > df.policy_version_min.min()
    stale = df.metadata.map(lambda m: json.loads(m)["stale"])
    assert (stale == (df.policy_version_max > df.policy_version_min)).all()  # max_staleness=0 marks spans
