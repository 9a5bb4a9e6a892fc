"""workers.liveness and the reassignment in workers.steps on a real Redis, without workers: heartbeats expire
into `lost`, a lost node's samples are claimed exactly once, a stale stage's writes are refused."""
from __future__ import annotations

import json
import threading
import time

import pytest

from workers import batches, liveness, steps


@pytest.fixture
def r(redis_base):
    client = batches.connect(redis_base + "/4")
    client.flushdb()
    return client


def test_heartbeat_expires_into_lost(r):
    assert not liveness.beat(r, "n1", 0.5, {"state": "alive", "load": 1, "in_flight": ["s1"]})
    assert liveness.beat(r, "n1", 0.5, {"state": "alive", "load": 1, "in_flight": ["s1"]})  # still there
    liveness.track(r, "n1", "b1", "s1")
    [n] = liveness.nodes(r)
    assert (n.node, n.state, n.load, n.in_flight) == ("n1", "alive", 1, ("s1",))
    time.sleep(0.7)
    assert liveness.silent_nodes(r) == ["n1"]
    [n] = liveness.nodes(r)
    assert (n.state, n.in_flight) == ("lost", ("s1",))
    liveness.untrack(r, "n1", "b1", "s1")
    liveness.leave(r, "n1")
    assert liveness.nodes(r)[0].state == "stopped"
    liveness.beat(r, "n1", 5, {"state": "draining"})
    assert liveness.nodes(r)[0].state == "draining"


def _held_sample(r, stage: str = "run") -> None:
    batches.create(r, "b1", "/x/batch.json", ["s1", "s2"], 2, 1, None)
    batches.update_sample(r, "b1", "s1", stage=stage, node="n1", task="t-old", attempt="attempt-1")
    batches.update_sample(r, "b1", "s2", stage="done", node="n1", task="t-done")
    liveness.track(r, "n1", "b1", "s1")
    liveness.track(r, "n1", "b1", "s2")
    liveness.beat(r, "n1", 0.1, {})  # then it falls silent
    time.sleep(0.2)


def test_a_lost_nodes_sample_is_claimed_once(r):
    _held_sample(r)
    sent, barrier = [], threading.Barrier(8)

    def claimer() -> None:
        barrier.wait()
        steps.reap(r, lambda name, args, **kw: sent.append((name, args, kw)))

    threads = [threading.Thread(target=claimer) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(sent) == 1  # eight reapers, one new prepare
    name, args, kw = sent[0]
    assert (name, args, kw["queue"]) == (steps.PREPARE, ["/x/batch.json", "s1"], "prepare")
    state = batches.sample_state(r, "b1", "s1")
    assert (state["stage"], state["task"], state["reassigned"], state["reassigned_from"], state["lost_from"]) == (
        "queued", kw["task_id"], 1, ["n1"], "n1")
    assert batches.sample_state(r, "b1", "s2")["stage"] == "done"  # a finished sample keeps its result
    assert liveness.held(r, "n1") == []
    assert batches.progress(r, "b1").reassigned == 1


def test_a_live_node_is_not_reaped_and_a_cancelled_batch_settles(r):
    _held_sample(r)
    liveness.beat(r, "n1", 5, {})  # back again
    assert steps.reap(r, lambda *a, **k: None) == []
    liveness.leave(r, "n1")
    batches.set_status(r, "b1", batches.CANCELLED)
    sent = []
    assert steps.reap(r, lambda *a, **k: sent.append(a)) == ["s1"]
    assert sent == [] and batches.sample_state(r, "b1", "s1")["stage"] == "cancelled"


def test_a_stale_stage_writes_nothing(r):
    _held_sample(r)
    assert batches.update_sample(r, "b1", "s1", if_task="t-old", stage="postrun") is not None
    steps.reassign(r, lambda *a, **k: None, "n1", "b1", "s1", "lost")
    assert batches.update_sample(r, "b1", "s1", if_task="t-old", stage="done") is None  # the old node came back
    assert batches.sample_state(r, "b1", "s1")["stage"] == "queued"

    calls = []

    @steps.discard_stale
    def stage(step) -> None:
        calls.append(1)
        raise steps.Stale(step.sample_id)

    stage(type("S", (), {"sample_id": "s1", "task_id": "t-old"})())  # logged and dropped, not raised
    assert calls == [1]


def test_drain_flag(r):
    assert liveness.drain_deadline(r, "n2") is None
    liveness.drain(r, "n2", 60)
    assert liveness.drain_deadline(r, "n2") == pytest.approx(time.time() + 60, abs=2)
    liveness.undrain(r, "n2")
    assert liveness.drain_deadline(r, "n2") is None


def test_a_sample_lost_too_often_is_masked_with_its_reason(r, tmp_path):
    """Lost more than POLAR_INFRA_RETRIES times: masked (weight 0, the reason), not given a zero reward."""
    from workers.manifest import plan, read_manifest, result_path, write_manifest
    from workers.sample_flow import NodeContext
    from workers.settings import load_settings

    tasks = tmp_path / "tasks.yaml"
    tasks.write_text("tasks: []\n")
    manifest = plan("b9", tmp_path / "b9", tasks, ["t"], 1)
    path = str(write_manifest(manifest))
    [sid] = [s.sample_id for s in manifest.samples]
    batches.create(r, "b9", path, [sid], 1, 1, None)
    batches.update_sample(r, "b9", sid, stage="queued", task="t-4", reassigned=3, reassigned_from=["n1", "n2", "n1"],
                          lost_from="n1", lost_reason="lost (no heartbeat)")
    sent = []
    settings = load_settings({"POLAR_NODE": "n3", "POLAR_INFRA_RETRIES": "2"})
    step = steps.Step(path, sid, NodeContext(settings, None), r, "t-4", lambda name, args, **kw: sent.append(name))
    steps.prepare(step)
    state = batches.sample_state(r, "b9", sid)
    assert (state["stage"], state["status"], state["failure"]) == ("masked", "error", "infrastructure")
    result = json.loads(result_path(read_manifest(path), sid).read_text())
    assert result["reward"] is None and result["weight"] == 0.0 and result["reassigned_from"] == ["n1", "n2", "n1"]
    assert "lost 3 times" in result["reason"] and "POLAR_INFRA_RETRIES is 2" in result["reason"]
    assert sent == [steps.GROUP]  # its group still completes


def test_a_queued_sample_reserved_by_a_lost_node_is_reassigned(r):
    """A prepare message a node received (prefetched, or waiting out a retry's countdown) and never started: when
    that node is lost the sample is queued again elsewhere, not left waiting on a message in a dead node's memory."""
    batches.create(r, "b1", "/x/batch.json", ["s1", "s2"], 2, 1, None)
    batches.update_sample(r, "b1", "s1", stage="queued", task="t-q")
    batches.update_sample(r, "b1", "s2", stage="queued", task="t-other")
    steps.reserve(r, "n1", "b1", "s1", "t-q")
    steps.reserve(r, "n1", "b1", "s2", "t-stale")  # a message the sample no longer waits on: not held
    assert batches.sample_state(r, "b1", "s1")["reserved_by"] == "n1"
    assert liveness.held(r, "n1") == [("b1", "s1")]
    assert steps.reap(r, lambda *a, **k: None) == []  # n1 never beat: nothing to reap yet
    liveness.beat(r, "n1", 0.1, {})  # then it falls silent
    time.sleep(0.2)
    sent = []
    assert steps.reap(r, lambda name, args, **kw: sent.append((name, args, kw))) == ["s1"]
    [(name, args, kw)] = sent
    assert (name, args, kw["queue"]) == (steps.PREPARE, ["/x/batch.json", "s1"], "prepare")
    state = batches.sample_state(r, "b1", "s1")
    assert (state["stage"], state["task"], state["reserved_by"], state["lost_from"]) == (
        "queued", kw["task_id"], None, "n1")
    assert batches.sample_state(r, "b1", "s2")["task"] == "t-other"


def test_a_drained_node_is_listed_draining_at_once(r):
    """`polar node drain` once showed the node alive until its next heartbeat (POLAR_HEARTBEAT_S later)."""
    liveness.beat(r, "n7", 30, {"state": "alive", "load": 0, "in_flight": []})
    liveness.drain(r, "n7", 60)
    [n] = [n for n in liveness.nodes(r) if n.node == "n7"]
    assert n.state == "draining" and r.pttl(liveness.key("n7")) > 20000  # its heartbeat's TTL is kept
    liveness.undrain(r, "n7")
    assert [n.state for n in liveness.nodes(r) if n.node == "n7"] == ["alive"]
    liveness.drain(r, "gone", 60)  # a node without a heartbeat gets none
    assert not r.exists(liveness.key("gone"))
    liveness.undrain(r, "gone")
