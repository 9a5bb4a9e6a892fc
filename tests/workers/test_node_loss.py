"""Nodes that die, freeze, drain or shut down, and a Redis restart, with nothing lost: real Redis (persistent, on a
data directory of its own so it can be restarted), two real `celery -A workers worker` nodes with a short liveness
timeout, the reference server, Pi sessions in bubblewrap sandboxes ("Wait SLOW": one 6 s tool call, reward 1).

Each test checks that every sample ends once, `completed` with its true reward, and once in the Parquet; that a
reassigned one says so (attempts, reassigned_from) and its first attempt is kept as abandoned (`node_lost`)."""
from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path
from typing import Callable, Iterator

import pytest

from polar.cli import main
from polar.run.local_redis import redis_command, start_redis
from polar.run.services import context_view
from polar_mitm.launch import free_port, wait_for_port
from tests.polar.run.test_killed_run import alive, descendants, describe
from tests.workers.cluster import Node, node_env, spawn_node, wait_ready
from tests.workers.test_rollouts import Cluster, records, wait_for
from workers import liveness, steps

# serial: its drains and hand-overs wait on timers that 3 parallel workers starved (scripts/test.sh runs the serial
# tests one at a time beside them, at a higher priority)
pytestmark = [pytest.mark.slow, pytest.mark.serial]

HERE = Path(__file__).parent
LIVENESS_S, HEARTBEAT_S = 4.0, 0.5


class Redis:
    """A redis-server that can be stopped (SIGTERM) and started again on the same port and data directory."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir, self.port = data_dir, free_port()
        self.proc = self.start()

    def start(self) -> subprocess.Popen:
        proc = start_redis(redis_command(self.data_dir, self.port), self.data_dir / "redis.log")
        wait_for_port(self.port, proc, self.data_dir / "redis.log", 20, "127.0.0.1")
        return proc

    def restart(self) -> None:
        self.proc.send_signal(signal.SIGTERM)  # redis writes its append-only file and exits
        self.proc.wait(30)
        self.proc = self.start()

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)


class Nodes(Cluster):
    def __init__(self, *args, redis: Redis, envs: dict[str, dict[str, str]]) -> None:
        super().__init__(*args)
        self.redis, self.envs = redis, envs
        self.client.transport.liveness_s = LIVENESS_S

    def restart(self, name: str) -> Node:
        """The node again under the same name (its old log kept beside the new one)."""
        old = self.nodes[name]
        old.stop()
        if old.log.exists():
            old.log.rename(old.log.with_name(f"worker-{time.time():.0f}.log"))
        self.nodes[name] = wait_ready(spawn_node(self.envs[name], 2, own_group=True))
        return self.nodes[name]

    def state(self, batch, sid: str) -> dict:
        return batch.samples()[sid]

    def wait_running(self, batch, name: str, count: int) -> list[str]:
        return wait_for(lambda: (lambda r: r if len(r) >= count else None)(self.running_on(batch, name)), 300,
                        f"{count} harnesses running on {name}")

    def held_when_draining(self, batch, name: str) -> set[str]:
        """Once `name` is listed draining (and has stopped taking samples): the samples it holds."""
        wait_for(lambda: [n for n in self.client.nodes() if n.node == name and n.state == "draining"], 10, "draining")
        time.sleep(1.0)
        return {s for s, st in batch.samples().items() if st.get("node") == name and st.get("stage") in steps.HELD}

    def running_on(self, batch, name: str) -> list[str]:
        """Samples whose harness runs on `name` and has made its first call."""
        return [s for s, st in batch.samples().items() if st.get("node") == name and st.get("stage") == "run"
                and records(self.root / "nodes" / name / "captures", f"*{s}*")]


@pytest.fixture(scope="module")
def nodes(tmp_path_factory, tiny_model_dir: Path, start_reference_server: Callable[..., str]) -> Iterator[Nodes]:
    root = tmp_path_factory.mktemp("node-loss")
    redis = Redis(root / "redis")
    base = f"redis://127.0.0.1:{redis.port}"
    model = context_view(tiny_model_dir, 65536, root / "model")
    engine = start_reference_server(HERE / "rollout_policy.yaml", model)
    broker, sessions = base + "/1", base + "/0"
    extra = {"POLAR_HEARTBEAT_S": str(HEARTBEAT_S), "POLAR_LIVENESS_S": str(LIVENESS_S), "POLAR_INFRA_RETRIES": "2"}
    envs = {n: node_env(broker, sessions, engine, model, root, n, runtime="auto", **extra) for n in ("n1", "n2")}
    cluster = Nodes(root, broker, sessions, engine, None, model, [], redis=redis, envs=envs)
    try:
        for name in envs:
            cluster.nodes[name] = spawn_node(envs[name], 2, own_group=True)
        for n in cluster.nodes.values():
            wait_ready(n)
        yield cluster
    finally:
        for n in cluster.nodes.values():
            n.stop()
        redis.stop()


def finished(nodes: Nodes, batch, timeout_s: float = 400):
    try:
        return batch.wait(timeout=timeout_s)
    except TimeoutError:
        pytest.fail(nodes.diagnose(batch))


def check_each_once(nodes: Nodes, batch) -> dict[str, dict]:
    """Every sample completed with reward 1 and is in the Parquet once (one session, no repeated rows)."""
    p = batch.progress()
    n = len(batch.manifest.samples)
    assert (p.status, p.done, p.masked, p.running) == ("completed", n, 0, 0), nodes.diagnose(batch)
    results = {r["sample_id"]: r for r in batch.results()}
    assert set(results) == {s.sample_id for s in batch.manifest.samples}
    for res in results.values():
        assert (res["status"], res["failure"], res["reward"]) == ("completed", None, 1.0), res
    df = batch.trajectories()
    sample_of = df.metadata.map(lambda m: json.loads(m)["sample"]["sample_id"])
    assert set(sample_of) == set(results) and not df.trajectory_id.duplicated().any()
    assert (df.groupby(sample_of).session_id.nunique() == 1).all()
    assert (df.weight == 1.0).all() and (df.reward == 1.0).all()
    return results


def check_reassigned(batch, results: dict[str, dict], victims: list[str], lost: str) -> list[str]:
    """The samples started again because `lost` was lost (the victims among them); returns them."""
    moved = sorted(s for s, st in batch.samples().items() if st.get("reassigned"))
    assert set(victims) <= set(moved) and batch.progress().reassigned == len(moved)
    df = batch.trajectories()
    meta = df.metadata.map(lambda m: json.loads(m)["sample"])
    for sid in moved:
        res = results[sid]
        assert (res["attempts"], res["reassigned_from"]) == (2, [lost]) and res["node"] != lost, res
        first = batch.dir / "samples" / sid / "attempt-1"
        abandoned = json.loads((first / "ABANDONED.json").read_text())
        assert abandoned["kind"] == "node_lost" and lost in abandoned["reason"], abandoned
        kept = records(first / "abandoned-captures") if (first / "abandoned-captures").exists() else []
        trained = {c for ids in df.call_ids[meta.map(lambda m: m["sample_id"] == sid)] for c in ids}
        assert trained and not trained & {r["call_id"] for r in kept}  # never trained on the lost attempt
        assert all(m["reassigned_from"] == [lost] and m["attempts"] == 2 for m in meta if m["sample_id"] == sid)
    for sid in set(results) - set(moved):
        assert results[sid]["reassigned_from"] == [] and results[sid]["attempts"] == 1
    return moved


def test_a_killed_node_loses_no_sample(nodes: Nodes, capsys):
    """SIGKILL of n1's whole process group mid-run (an OOM kill, a lost machine): its samples start over on n2,
    and nothing n1 started outlives it (its watchdog, polar/sandbox/supervisor.py, stops the sandboxes, which run
    in process groups of their own, and the proxy, then exits)."""
    batch = nodes.submit(("slow-k", "slow"), group_size=8)
    victims = nodes.wait_running(batch, "n1", 2)
    stale = {s: (nodes.state(batch, s)["task"], nodes.state(batch, s)["attempt"]) for s in victims}
    started = descendants(nodes.nodes["n1"].proc.pid)
    killed_at = time.monotonic()
    nodes.nodes["n1"].signal_group(signal.SIGKILL)
    nodes.nodes["n1"].proc.wait(30)
    assert len(started) >= 4, describe(started)  # the pool, the watchdog, the proxy, the sandboxes at least
    deadline = time.monotonic() + 30
    while (left := alive(started)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left, f"left after n1's SIGKILL:\n{describe(left)}"
    wait_for(lambda: [n for n in nodes.client.nodes() if n.node == "n1" and n.state == "lost"], 30, "n1 lost")
    finished(nodes, batch)
    took = time.monotonic() - killed_at
    results = check_each_once(nodes, batch)
    moved = check_reassigned(batch, results, victims, "n1")
    per_node = {n: sum(1 for r in results.values() if r["node"] == n) for n in ("n1", "n2")}
    figures = {"kill_to_end_s": round(took, 1), "liveness_s": LIVENESS_S, "samples": len(results),
               "per_node": per_node, "reassigned": len(moved)}
    (nodes.root / "kill-figures.json").write_text(json.dumps(figures))
    print("node loss:", json.dumps(figures))
    assert took < LIVENESS_S + 120  # the liveness timeout plus the work, not the broker's 6 h
    capsys.readouterr()
    assert main(["status", batch.batch_id, "--broker", nodes.broker]) == 0
    out = capsys.readouterr().out
    assert f"{len(moved)} reassigned" in out and f"reassigned {moved[0]}: from n1 to n2" in out
    assert "n1 lost" in out

    # n1 comes back under the same name; what its queues still held for the reassigned samples is delivered now
    before = {s: (batch.dir / "samples" / s / "result.json").read_bytes() for s in results}
    node = nodes.restart("n1")
    for sid, (task, attempt) in stale.items():
        for name in ("run", "postrun"):
            nodes.client.transport.messages.enqueue(f"workers.stage_tasks.{name}",
                                                    [str(batch.dir / "batch.json"), sid, attempt],
                                                    queue=f"n1.{name}", task_id=task)
    wait_for(lambda: node.log.read_text(errors="replace").count("discarded a stale") >= 2 * len(stale), 60,
             "the stale messages discarded")
    assert {s: (batch.dir / "samples" / s / "result.json").read_bytes() for s in results} == before
    assert check_each_once(nodes, batch) == results
    assert [n.state for n in nodes.client.nodes() if n.node == "n1"] == ["alive"]


def test_a_frozen_node_that_comes_back_runs_nothing_twice(nodes: Nodes):
    """n1 stops (SIGSTOP) mid-run, is declared lost, its samples finish on n2; then it resumes (SIGCONT) under
    its own name, its harnesses and stages carrying on: none of that is written."""
    batch = nodes.submit(("slow-f", "slow"), group_size=4)
    victims = nodes.wait_running(batch, "n1", 1)
    n1 = nodes.nodes["n1"]
    n1.signal_group(signal.SIGSTOP)
    try:
        finished(nodes, batch)
        results = check_each_once(nodes, batch)
        snapshot = (batch.samples(), {s: (batch.dir / "samples" / s / "result.json").read_bytes() for s in results})
    finally:
        n1.signal_group(signal.SIGCONT)
    moved = check_reassigned(batch, results, victims, "n1")
    wait_for(lambda: "heartbeat had lapsed" in n1.log.read_text(errors="replace"), 30, "n1 noticing it was lost")
    wait_for(lambda: n1.log.read_text(errors="replace").count("discarded a stale") >= len(moved), 120,
             "n1's own stages of the reassigned samples discarded")
    wait_for(lambda: [n for n in nodes.client.nodes() if n.node == "n1" and n.load == 0], 30, "n1 idle again")
    time.sleep(2 * HEARTBEAT_S)
    assert (batch.samples(), {s: (batch.dir / "samples" / s / "result.json").read_bytes() for s in results}) == snapshot
    assert check_each_once(nodes, batch) == results
    assert [n.state for n in nodes.client.nodes() if n.node == "n1"] == ["alive"]


def check_drained_in_place(nodes: Nodes, batch, running: list[str]) -> None:
    """n1 drains: what it held then (its running samples among them) finishes there, in one attempt; the rest on n2."""
    held = nodes.held_when_draining(batch, "n1")
    finished(nodes, batch)
    results = check_each_once(nodes, batch)
    assert set(running) <= held
    for sid, res in results.items():
        assert res["node"] == ("n1" if sid in held else "n2") and res["attempts"] == 1, res


def test_a_drained_node_finishes_its_samples_and_takes_no_new_ones(nodes: Nodes):
    batch = nodes.submit(("slow-d", "slow"), group_size=8)
    running = nodes.wait_running(batch, "n1", 1)
    argv = ["--broker", nodes.broker]
    assert main(["node", "drain", "n1", "--deadline", "120", *argv]) == 0
    try:
        check_drained_in_place(nodes, batch, running)
        # the listed load is the node's last heartbeat's: the one after its last sample ended says 0
        wait_for(lambda: [n for n in nodes.client.nodes() if n.node == "n1" and (n.state, n.load) == ("draining", 0)],
                 10, "n1 draining with nothing in flight")
    finally:  # undrained even when a check failed, so the module's other tests still find n1 taking samples
        assert main(["node", "undrain", "n1", *argv]) == 0
    wait_for(lambda: [n for n in nodes.client.nodes() if n.node == "n1" and n.state == "alive"], 10, "alive again")


def test_a_drain_past_its_deadline_hands_over(nodes: Nodes):
    batch = nodes.submit(("slow-h", "slow"), group_size=4)
    running = nodes.wait_running(batch, "n1", 1)
    nodes.client.drain("n1", deadline_s=0.5)  # far less than the 6 s the harness takes
    try:
        finished(nodes, batch)
        results = check_each_once(nodes, batch)
        check_reassigned(batch, results, running, "n1")
    finally:
        nodes.client.undrain("n1")


def test_sigterm_drains_then_stops(nodes: Nodes):
    """SIGTERM of a worker: no new samples there, its running ones finish there, then it exits, listed stopped."""
    batch = nodes.submit(("slow-t", "slow"), group_size=8)
    running = nodes.wait_running(batch, "n1", 1)
    n1 = nodes.nodes["n1"]
    n1.proc.send_signal(signal.SIGTERM)  # the main process only, as `celery multi stop` or systemd's mixed mode
    check_drained_in_place(nodes, batch, running)
    assert n1.proc.wait(60) == 0
    assert [n.state for n in nodes.client.nodes() if n.node == "n1"] == ["stopped"]
    nodes.restart("n1")


def test_a_redis_restart_loses_nothing(nodes: Nodes):
    """Redis stopped (SIGTERM) and started again on its port and data directory with 8 samples queued or running."""
    batch = nodes.submit(("slow-r", "slow"), group_size=8)
    wait_for(lambda: sum(1 for st in batch.samples().values() if st.get("stage") == "run") >= 2, 300,
             "harnesses running")
    stages = {st.get("stage") for st in batch.samples().values()}
    nodes.redis.restart()
    finished(nodes, batch)
    results = check_each_once(nodes, batch)
    assert "queued" in stages or "prepare" in stages  # some were still waiting
    assert all(r["reassigned_from"] == [] for r in results.values())  # nobody was declared lost
    assert sorted(n.state for n in nodes.client.nodes()) == ["alive", "alive"]
    assert steps.reap(nodes.client.transport.redis, nodes.client.transport.messages.enqueue) == []
    assert liveness.silent_nodes(nodes.client.transport.redis) == []
