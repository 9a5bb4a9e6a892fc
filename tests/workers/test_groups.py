"""workers.groups: group advantages over usable samples, masking, staleness, one part per group."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from polar_traj.parquet import TrajectoryWriter
from workers.groups import GroupConfig, sample_advantages, write_group


def row(sample_id: str, versions=(0, 0)) -> dict:
    return {"trajectory_id": f"{sample_id}/prefix_merge/c1", "task_id": "t", "session_id": sample_id,
            "group_id": "t", "strategy": "prefix_merge", "status": "completed", "prompt_ids": [1, 2],
            "response_ids": [3, 4], "loss_mask": [1, 1], "logprobs": [-0.5, -0.25], "call_ids": ["c1"],
            "num_calls": 1, "prompt_len": 2, "response_len": 2, "policy_version_min": versions[0],
            "policy_version_max": versions[1], "reward": None, "advantage": None, "weight": 1.0, "metadata": "{}"}


def result(tmp: Path, sample_id: str, reward, status="completed", failure=None, versions=(0, 0)) -> dict:
    part = tmp / f"{sample_id}.parquet"
    with TrajectoryWriter(part) as w:
        w.write(row(sample_id, versions))
    return {"sample_id": sample_id, "reward": reward, "status": status, "failure": failure,
            "reason": "image unreachable" if failure else None, "trajectories": str(part), "node": "n1"}


def test_advantages_leave_out_masked_samples():
    results = [{"sample_id": "a", "reward": 1.0, "status": "completed"},
               {"sample_id": "b", "reward": 0.0, "status": "completed"},
               {"sample_id": "c", "reward": 0.0, "status": "timeout", "failure": "agent_timeout"},
               {"sample_id": "d", "reward": None, "status": "error", "failure": "infrastructure"}]
    adv = sample_advantages(results, GroupConfig().advantages)
    assert adv["a"] == pytest.approx(1 - 1 / 3) and adv["b"] == pytest.approx(-1 / 3)
    assert adv["c"] == pytest.approx(-1 / 3)  # a timeout trains with reward 0
    assert adv["d"] is None


def test_group_part(tmp_path: Path):
    results = [result(tmp_path, "s0", 1.0), result(tmp_path, "s1", 0.0, versions=(0, 3)),
               result(tmp_path, "s2", None, "error", "infrastructure")]
    path = write_group(tmp_path / "batch", "g1", results, GroupConfig(max_staleness=1))
    df = pd.read_parquet(path).set_index("session_id")
    assert list(df.group_id.unique()) == ["g1"]
    assert df.loc["s0", "advantage"] == pytest.approx(0.5) and df.loc["s1", "advantage"] == pytest.approx(-0.5)
    masked = df.loc["s2"]
    assert masked.weight == 0 and pd.isna(masked.advantage) and list(masked.loss_mask) == [0, 0]
    meta = {sid: json.loads(df.loc[sid, "metadata"]) for sid in df.index}
    assert meta["s2"]["sample"]["reason"] == "image unreachable" and meta["s2"]["sample"]["masked"]
    assert (meta["s0"]["stale"], meta["s1"]["stale"]) == (False, True)
    # rewritten whole on a second call (a redelivered group task), never appended to
    write_group(tmp_path / "batch", "g1", results, GroupConfig())
    assert len(pd.read_parquet(tmp_path / "batch" / "trajectories")) == 3
