"""polar.trl.rollouts: trajectory rows to trainer rows and to GRPOTrainer's rollout_func layout."""
from __future__ import annotations

import json

import pytest

from polar.trl.rollouts import StepRollouts, row_from_record, trl_fields


def record(sample: str, task: str, reward, weight=1.0, versions=(0, 0)) -> dict:
    return {"trajectory_id": f"{sample}/prefix_merge/c1", "task_id": task, "group_id": f"b.{task}",
            "prompt_ids": [1, 2], "response_ids": [3, 4, 5], "loss_mask": [1, 0, 1],
            "logprobs": [-0.5, 0.0, -0.25], "policy_version_min": versions[0], "policy_version_max": versions[1],
            "reward": reward, "advantage": None if weight == 0 else 0.1, "weight": weight,
            "metadata": json.dumps({"stale": versions[0] != versions[1]})}


def test_row_from_record():
    row = row_from_record(record("s0", "t", 0.5, versions=(1, 2)))
    assert (row.task_id, row.loss_mask, row.old_logprobs, row.reward) == ("t", [1, 0, 1], [-0.5, 0.0, -0.25], 0.5)
    assert (row.policy_version_min, row.policy_version_max, row.stale) == (1, 2, True)
    assert row_from_record(record("s1", "t", float("nan"), weight=0)).reward is None


def test_trl_fields_keep_masked_rows_in_place_untrained():
    rows = [row_from_record(record(f"s{i}", t, 0.25 * i, weight=0 if i == 1 else 1))
            for t in ("a", "b") for i in range(2)]
    step = StepRollouts("b", rows, 1.0)
    out = trl_fields(step, ["a", "b"], 2)
    assert out["completion_ids"] == [[3, 4, 5]] * 4 and out["logprobs"][0] == [-0.5, 0.0, -0.25]
    assert out["env_mask"] == [[1, 0, 1], [0, 0, 0], [1, 0, 1], [0, 0, 0]]  # loss mask; weight 0: nothing trained
    assert out["polar_reward"] == [0.0, None, 0.0, None]  # None: TRL leaves it out of the baseline
    assert step.reward_mean() == 0.0 and step.versions() == {0}
    with pytest.raises(ValueError, match="group a has 2 trajectories, expected 3"):
        trl_fields(step, ["a", "b"], 3)


def test_rows_too_old_for_the_trainer_are_not_trained(tmp_path):
    from polar.trl.rollouts import PolarRollouts, RolloutConfig

    rollouts = PolarRollouts(None, [], RolloutConfig(group_size=2, out=tmp_path, max_staleness=1))
    rollouts.update_model_version(3)
    old, recent = (row_from_record(record("s0", "t", 0.5, versions=(1, 1))),
                   row_from_record(record("s1", "t", 0.5, versions=(2, 2))))
    assert rollouts.too_old(old) and not rollouts.too_old(recent)
    from dataclasses import replace

    out = trl_fields(StepRollouts("b", [replace(old, stale=True), recent], 1.0), ["t"], 2)
    assert out["env_mask"] == [[0, 0, 0], [1, 0, 1]] and out["polar_reward"] == [None, 0.5]


class FakeBatch:
    def __init__(self, n: int, task_ids: list[str]) -> None:
        self.batch_id, self.task_ids, self.cancelled = f"b{n}", task_ids, False

    def wait(self, timeout: float, poll_s: float) -> None:
        pass

    def cancel(self) -> bool:
        self.cancelled = True
        return True

    def trajectories(self):
        import pandas as pd

        return pd.DataFrame([record(f"{self.batch_id}.{t}", t, 0.5) for t in self.task_ids])


class FakeClient:
    """PolarClient's outer edge: submit() hands out batches that are already finished."""

    def __init__(self) -> None:
        self.batches: list[FakeBatch] = []

    def submit(self, tasks_file, **kwargs) -> FakeBatch:
        import yaml

        ids = [t["task_id"] for t in yaml.safe_load(open(tasks_file))["tasks"]]
        self.batches.append(FakeBatch(len(self.batches), ids))
        return self.batches[-1]


def test_overlap_submits_the_next_batch_ahead(tmp_path):
    from polar.trl.rollouts import PolarRollouts, RolloutConfig

    client = FakeClient()
    tasks = [{"task_id": t} for t in ("a", "b")]
    rollouts = PolarRollouts(client, tasks, RolloutConfig(group_size=1, out=tmp_path, overlap=True))
    first = rollouts.collect(["a", "b"])
    assert first.batch_id == "b0" and len(client.batches) == 2  # b1 already running for the next step
    assert rollouts.collect(["a", "b"]).batch_id == "b1" and len(client.batches) == 3
    assert rollouts.collect(["a"]).batch_id == "b3" and client.batches[2].cancelled  # other tasks: not used
    rollouts.stop()
    assert client.batches[-1].cancelled
