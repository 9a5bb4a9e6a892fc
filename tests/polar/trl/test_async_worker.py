"""polar.trl.async_worker: TRL's rollout-worker protocol over Polar's batches (the trainer itself needs a GPU:
scripts/gpu_check.sh). Checked on the CPU with finished batches: the samples TRL reads, the cycling through the
task set, the version it is told, and a failure surfacing through check_health."""
from __future__ import annotations

import time

import pytest

from polar.trl.async_worker import PolarRolloutWorker, rollout_sample
from polar.trl.rollouts import PolarRollouts, RolloutConfig, row_from_record
from tests.polar.trl.conftest import FakeClient, record


def test_a_row_as_trls_sample():
    row = row_from_record(record("s0", "t", 0.5, versions=(3, 3)))
    s = rollout_sample(row, group_id=7)
    assert s.input_ids.tolist() == [1, 2, 3, 4, 5] and s.completion_mask.tolist() == [0, 0, 1, 0, 1]
    assert s.old_log_probs.tolist() == [0.0, 0.0, -0.5, 0.0, -0.25]  # the recorded logprobs: the old policy
    assert (s.advantage, s.model_version, s.group_id, s.metrics["reward"]) == (0.1, 3, 7, 0.5)


def test_the_worker_fills_trls_queue_cycling_through_the_tasks(tmp_path, tasks_file):
    client = FakeClient()
    rollouts = PolarRollouts(client, tasks_file, RolloutConfig(group_size=1, out=tmp_path))
    worker = PolarRolloutWorker(rollouts, groups_per_step=1, queue_maxsize=3)
    worker.start()
    got = [worker.rollout_buffer.get(timeout=30) for _ in range(4)]
    worker.update_model_version(5)
    worker.stop()
    assert [s.group_id for s in got] == [0, 1, 2, 3] and rollouts.model_version == 5
    assert [k["task_ids"] for k in client.submitted[:4]] == [["vowels-0"], ["vowels-1"]] * 2
    worker.check_health(stale_after_s=0)  # stopped by the trainer: healthy
    assert not worker.metrics_queue.empty()


def test_a_failed_collect_surfaces_in_check_health(tmp_path, tasks_file):
    class Broken(FakeClient):
        def submit(self, tasks_file, **kwargs):
            raise ConnectionError("broker gone")

    worker = PolarRolloutWorker(PolarRollouts(Broken(), tasks_file, RolloutConfig(1, tmp_path)), groups_per_step=2)
    worker.start()
    deadline = time.monotonic() + 30
    while worker._thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    with pytest.raises(RuntimeError, match="broker gone"):
        worker.check_health(stale_after_s=0)
