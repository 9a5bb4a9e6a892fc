"""outcomes.py: outcome files, masking rules, group advantages, weights."""
from __future__ import annotations

import json

import numpy as np
import pytest
import yaml

from polar_traj.build import Trajectory
from polar_traj.outcomes import (AdvantageConfig, OutcomePlan, Resolved, group_advantages, load_outcomes,
                                 parse_outcomes, resolve)
from polar_traj.reading import SessionFile


def traj(session_id: str, first: str, task_id: str = "task", mask=(1, 1)) -> Trajectory:
    return Trajectory(f"{session_id}/prefix_merge/{first}", task_id, session_id, "prefix_merge", [first],
                      [1], [2, 3], list(mask), [-0.5, 0.0], (1, 1), {"api": "openai_chat"}, group_id=task_id)


def files(*pairs):
    return [SessionFile(task, sid, None) for task, sid in pairs]


@pytest.mark.parametrize("suffix", [".json", ".jsonl", ".yaml"])
def test_load_each_file_format(tmp_path, suffix):
    entries = [{"session_id": "s1", "reward": 1}, {"trajectory_id": "s1/prefix_merge/c2", "reward": 0.5},
               {"session_id": "s2", "status": "timeout", "harness": "claude"}]
    path = tmp_path / f"outcomes{suffix}"
    if suffix == ".jsonl":
        path.write_text("\n".join(json.dumps(e) for e in entries) + "\n")
    elif suffix == ".yaml":
        path.write_text(yaml.safe_dump(entries))
    else:
        path.write_text(json.dumps(entries))
    outcomes = load_outcomes(path)
    assert outcomes.sessions["s1"]["reward"] == 1.0 and outcomes.sessions["s2"]["harness"] == "claude"
    assert outcomes.trajectories["s1/prefix_merge/c2"]["reward"] == 0.5


def test_mapping_shapes():
    plain = parse_outcomes({"s1": 1, "s2": {"reward": 0, "group_id": "g"}, "s3": None})
    assert plain.sessions["s1"] == {"reward": 1.0, "session_id": "s1"}
    assert plain.sessions["s2"]["group_id"] == "g" and plain.sessions["s3"]["reward"] is None
    split = parse_outcomes({"sessions": {"s1": 1.0}, "trajectories": [{"trajectory_id": "s1/x/c", "reward": 0}]})
    assert split.sessions["s1"]["reward"] == 1.0 and split.trajectories["s1/x/c"]["reward"] == 0.0


@pytest.mark.parametrize("data, message", [
    ([{"session_id": "s", "rewrd": 1}], "unknown outcome fields"),
    ([{"session_id": "s", "status": "failed"}], "status 'failed'"),
    ([{"session_id": "s", "reward": True}], "reward True"),
    ([{"session_id": "s", "reward": float("nan")}], "finite"),
    ([{"session_id": "s", "failure": "oops"}], "failure 'oops'"),
    ([{"reward": 1}], "neither session_id nor trajectory_id"),
    ("reward", "list or a mapping"),
])
def test_invalid_outcomes(data, message):
    with pytest.raises(ValueError, match=message):
        parse_outcomes(data)


def test_invalid_file_names_the_file(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps([{"session_id": "s", "status": "nope"}]))
    with pytest.raises(ValueError, match="bad.json"):
        load_outcomes(path)


@pytest.mark.parametrize("entry, expected", [
    ({"reward": 1.0}, Resolved("completed", 1.0, True, None, None)),
    ({"reward": 0.7, "status": "timeout"}, Resolved("timeout", 0.0, True, "agent_timeout", None)),
    ({"failure": "agent_timeout"}, Resolved("timeout", 0.0, True, "agent_timeout", None)),
    ({"failure": "malformed_tool_call", "reason": "bad json"},
     Resolved("completed", 0.0, True, "malformed_tool_call", "bad json")),
    ({"status": "error", "reason": "sandbox died"}, Resolved("error", None, False, "infrastructure", "sandbox died")),
    ({"failure": "infrastructure", "reward": 1.0}, Resolved("error", 1.0, False, "infrastructure", None)),
    ({}, Resolved("completed", None, True, None, None)),
])
def test_masking_rules(entry, expected):
    assert resolve(entry) == expected


def test_group_advantages_mean_std_and_leave_one_out():
    units = {"a": ("g", 1.0), "b": ("g", 0.0), "c": ("g", 0.0), "d": ("g", 1.0), "solo": ("h", 1.0)}
    plain = group_advantages(units, AdvantageConfig())
    assert [plain[k] for k in "abcd"] == [0.5, -0.5, -0.5, 0.5] and plain["solo"] == 0.0
    scaled = group_advantages(units, AdvantageConfig(std_scale=True))
    std = np.std([1, 0, 0, 1], ddof=1)
    assert scaled["a"] == pytest.approx(0.5 / (std + 1e-6))
    loo = group_advantages({"a": ("g", 1.0), "b": ("g", 0.0), "c": ("g", 0.0)}, AdvantageConfig(leave_one_out=True))
    assert loo == pytest.approx({"a": 1.0, "b": -0.5, "c": -0.5})
    same = group_advantages({"a": ("g", 1.0), "b": ("g", 1.0)}, AdvantageConfig(std_scale=True))
    assert same == {"a": 0.0, "b": 0.0}


def test_plan_broadcasts_session_rewards_and_groups_by_task():
    outcomes = parse_outcomes([{"session_id": "s1", "reward": 1.0, "harness": "codex"},
                               {"session_id": "s2", "reward": 0.0, "metadata": {"harness": "claude", "repo": "x"}}])
    plan = OutcomePlan(outcomes, files(("t", "s1"), ("t", "s2"), ("t", "s3")), AdvantageConfig(weight="session"))
    a, b = plan.apply([traj("s1", "c0", "t"), traj("s1", "c5", "t")])
    assert (a.reward, a.advantage, a.weight, a.group_id) == (1.0, 0.5, 0.5, "t")
    assert b.reward == 1.0 and b.metadata["harness"] == "codex"
    (c,) = plan.apply([traj("s2", "c0", "t")])
    assert (c.advantage, c.weight, c.metadata["harness"], c.metadata["task"]) == (-0.5, 1.0, "claude",
                                                                                  {"harness": "claude", "repo": "x"})
    (d,) = plan.apply([traj("s3", "c0", "t")])  # no outcome: no reward, no advantage, still trainable
    assert (d.reward, d.advantage, d.status, d.loss_mask) == (None, None, "completed", [1, 1])


def test_plan_infrastructure_error_is_masked_with_its_reason():
    outcomes = parse_outcomes([{"session_id": "s1", "reward": 1.0},
                               {"session_id": "s2", "status": "error", "reason": "sandbox died", "reward": 0.0}])
    plan = OutcomePlan(outcomes, files(("t", "s1"), ("t", "s2")), AdvantageConfig())
    (e,) = plan.apply([traj("s2", "c0", "t")])
    assert (e.status, e.loss_mask, e.weight, e.advantage) == ("error", [0, 0], 0.0, None)
    assert e.metadata["outcome"] == {"status": "error", "failure": "infrastructure", "reason": "sandbox died",
                                     "reward_source": "session", "masked": True}
    (ok,) = plan.apply([traj("s1", "c0", "t")])
    assert ok.advantage == 0.0  # the errored session is not part of the group baseline


def test_plan_timeout_is_trainable_at_zero():
    outcomes = parse_outcomes([{"session_id": "s1", "reward": 1.0}, {"session_id": "s2", "status": "timeout"}])
    plan = OutcomePlan(outcomes, files(("t", "s1"), ("t", "s2")), AdvantageConfig())
    (t,) = plan.apply([traj("s2", "c0", "t")])
    assert (t.status, t.reward, t.advantage, t.loss_mask, t.weight) == ("timeout", 0.0, -0.5, [1, 1], 1.0)


def test_plan_per_trajectory_rewards_and_explicit_groups():
    outcomes = parse_outcomes({"sessions": {"s1": {"group_id": "G"}, "s2": {"group_id": "G"}},
                               "trajectories": {"s1/prefix_merge/c0": 1.0, "s1/prefix_merge/c5": 0.0,
                                                "s2/prefix_merge/c0": 0.5}})
    plan = OutcomePlan(outcomes, files(("t1", "s1"), ("t2", "s2")), AdvantageConfig())
    a, b = plan.apply([traj("s1", "c0", "t1"), traj("s1", "c5", "t1")])
    (c,) = plan.apply([traj("s2", "c0", "t2")])
    assert [x.reward for x in (a, b, c)] == [1.0, 0.0, 0.5]
    assert [x.advantage for x in (a, b, c)] == pytest.approx([0.5, -0.5, 0.0])
    assert {x.group_id for x in (a, b, c)} == {"G"}
    assert a.metadata["outcome"]["reward_source"] == "trajectory"


def test_weight_mode_is_validated():
    with pytest.raises(ValueError, match="weight"):
        AdvantageConfig(weight="half")
