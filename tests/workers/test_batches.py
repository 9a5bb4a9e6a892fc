"""workers.batches and workers.steps.stop_batch on a real Redis: progress, group counters, cancel."""
from __future__ import annotations

import pytest

from workers import batches
from workers.steps import stop_batch


@pytest.fixture
def r(redis_base):
    client = batches.connect(redis_base + "/1")
    client.flushdb()
    return client


def test_progress_and_groups(r):
    batches.create(r, "b1", "/x/batch.json", ["g.0", "g.1", "h.0", "h.1"], 2, 2, None)
    with pytest.raises(ValueError, match="already exists"):
        batches.create(r, "b1", "/x/batch.json", ["g.0"], 1, 1, None)
    batches.update_sample(r, "b1", "g.0", stage="done", reward=1.0, node="n1")
    batches.update_sample(r, "b1", "g.1", stage="masked", node="n2")
    batches.update_sample(r, "b1", "h.0", stage="run", node="n2")
    p = batches.progress(r, "b1")
    assert (p.total, p.done, p.masked, p.running, p.queued, p.reward_mean) == (4, 1, 1, 1, 1, 1.0)
    assert p.nodes == {"n1": 1, "n2": 2} and not p.finished
    assert batches.mark_final(r, "b1", "g", "g.0") == 1
    assert batches.mark_final(r, "b1", "g", "g.0") == 1  # a redelivered postrun counts once
    assert batches.mark_final(r, "b1", "g", "g.1") == 2
    assert batches.mark_group_done(r, "b1", "g") == 1
    assert batches.set_status(r, "b1", batches.COMPLETED)
    assert not batches.set_status(r, "b1", batches.CANCELLED)  # the first final status wins
    assert batches.progress(r, "b1").finished


def test_stop_batch_revokes(r):
    batches.create(r, "b2", "/x/batch.json", ["a", "b", "c", "d"], 4, 1, None)
    batches.update_sample(r, "b2", "a", stage="queued", task="t-a")
    batches.update_sample(r, "b2", "b", stage="run", task="t-b")
    batches.update_sample(r, "b2", "c", stage="postrun", task="t-c")
    batches.update_sample(r, "b2", "d", stage="done", task="t-d")
    revoked = []
    assert stop_batch(r, lambda task, terminate: revoked.append((task, terminate)), "b2")
    assert sorted(revoked) == [("t-a", False), ("t-b", True)]  # a postrun finishes on its own, sees the cancel
    states = batches.samples(r, "b2")
    assert (states["a"]["stage"], states["d"]["stage"]) == ("cancelled", "done")
    assert not stop_batch(r, lambda *a, **k: None, "b2")
    with pytest.raises(KeyError, match="no batch"):
        batches.info(r, "nope")
