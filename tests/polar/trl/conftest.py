"""Shared by the polar.trl tests: trajectory records as the service writes them, a tasks file, and a client that
hands out finished batches (PolarClient's outer edge, for tests of what the trainer side does with them)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest


def record(sample: str, task: str, reward, weight=1.0, versions=(0, 0)) -> dict:
    return {"trajectory_id": f"{sample}/prefix_merge/c1", "task_id": task, "group_id": f"b.{task}",
            "prompt_ids": [1, 2], "response_ids": [3, 4, 5], "loss_mask": [1, 0, 1],
            "logprobs": [-0.5, 0.0, -0.25], "policy_version_min": versions[0], "policy_version_max": versions[1],
            "reward": reward, "advantage": None if weight == 0 else 0.1, "weight": weight,
            "metadata": json.dumps({"stale": versions[0] != versions[1]})}


@pytest.fixture
def tasks_file(tmp_path: Path) -> Path:
    from polar.trl.task import write_tasks

    return write_tasks(tmp_path / "tasks.yaml", 2)  # vowels-0, vowels-1


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
        self.submitted: list[dict] = []  # each submit's keyword arguments

    def submit(self, tasks_file, **kwargs) -> FakeBatch:
        self.submitted.append(kwargs)
        self.batches.append(FakeBatch(len(self.batches), list(kwargs["task_ids"])))
        return self.batches[-1]
