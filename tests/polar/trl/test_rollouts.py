"""polar.trl.rollouts: trajectory rows to trainer rows and to GRPOTrainer's rollout_func layout."""
from __future__ import annotations

import json

import pytest

from polar.trl.rollouts import StepRollouts, row_from_record, trl_fields
from tests.polar.trl.conftest import FakeClient, record


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


def test_rows_without_call_spans_go_by_their_oldest_call(tmp_path, tasks_file):
    from polar.trl.rollouts import PolarRollouts, RolloutConfig

    rollouts = PolarRollouts(None, tasks_file, RolloutConfig(group_size=2, out=tmp_path, max_staleness=1))
    rollouts.update_model_version(3)
    old, recent = (row_from_record(record("s0", "t", 0.5, versions=(1, 1))),
                   row_from_record(record("s1", "t", 0.5, versions=(2, 2))))
    (old, n_old), (recent, n_recent) = rollouts.apply_staleness(old), rollouts.apply_staleness(recent)
    assert old.stale and not recent.stale and n_old == n_recent == 0
    out = trl_fields(StepRollouts("b", [old, recent], 1.0), ["t"], 2)
    assert out["env_mask"] == [[0, 0, 0], [1, 0, 1]] and out["polar_reward"] == [None, 0.5]


def two_calls(sample: str, versions: tuple[int, int]) -> dict:
    """A merged row of two calls (one sampled token each, a template token between) at the given versions;
    Polar's service marked it stale (its calls span versions)."""
    rec = record(sample, "t", 0.5, versions=(min(versions), max(versions)))
    rec["metadata"] = json.dumps({"stale": versions[0] != versions[1],
                                  "call_outputs": [[0, 1, versions[0]], [2, 3, versions[1]]]})
    return rec


def test_staleness_applies_per_call(tmp_path, tasks_file):
    from polar.trl.rollouts import PolarRollouts, RolloutConfig

    row = row_from_record(two_calls("s0", (2, 3)))
    assert row.call_outputs == ((0, 1, 2), (2, 3, 3)) and row.stale  # Polar's mark: spans versions
    rollouts = PolarRollouts(None, tasks_file, RolloutConfig(group_size=1, out=tmp_path, max_staleness=0))
    rollouts.update_model_version(3)
    kept, masked = rollouts.apply_staleness(row)
    assert kept.loss_mask == [0, 0, 1] and not kept.stale and masked == 1  # the old call out, the new one trained
    rollouts.update_model_version(4)
    gone, masked = rollouts.apply_staleness(row)
    assert gone.loss_mask == [0, 0, 0] and gone.stale and masked == 2
    step = StepRollouts("b", [kept], 1.0, trainer_version=3)
    assert trl_fields(step, ["t"], 1)["env_mask"] == [[0, 0, 1]] and step.lag(kept) == 1


def test_overlap_submits_the_next_batch_ahead(tmp_path, tasks_file):
    from polar.trl.rollouts import PolarRollouts, RolloutConfig

    client = FakeClient()
    rollouts = PolarRollouts(client, tasks_file, RolloutConfig(group_size=1, out=tmp_path, overlap=True))
    both = rollouts.task_ids
    first = rollouts.collect(both)
    assert first.batch_id == "b0" and len(client.batches) == 2  # b1 already running for the next step
    assert rollouts.collect(both).batch_id == "b1" and len(client.batches) == 3
    assert rollouts.collect(both[:1]).batch_id == "b3" and client.batches[2].cancelled  # other tasks: not used
    rollouts.stop()
    assert client.batches[-1].cancelled
    assert client.submitted[0]["task_ids"] == both and client.submitted[-1]["task_ids"] == both[:1]


def test_a_step_where_every_group_scored_alike_says_it_teaches_nothing():
    """GRPO learns only from groups whose rewards differ: a step without one is named (issue 71 item 5)."""
    from polar.trl.grpo import StepReport, zero_signal

    flat = [row_from_record(record(f"s{i}", t, 1.0)) for t in ("a", "b") for i in range(2)]
    mixed = [*flat[:2], row_from_record(record("s2", "b", 0.0)), row_from_record(record("s3", "b", 1.0))]
    masked = [*flat[:2], row_from_record(record("s2", "b", 0.0, weight=0)), flat[3]]  # a masked 0 is no signal
    assert StepRollouts("x", flat, 1.0).signal() == (0, 2)
    assert StepRollouts("x", mixed, 1.0).signal() == (1, 2)
    assert StepRollouts("x", masked, 1.0).signal() == (0, 2)

    def report(signal: int, groups: int) -> StepReport:
        return StepReport(3, "x", 4, 1.0, float("nan"), 1.0, 1.0, [0], 1.0, 1.0, 0.0, {0: 4}, 0, 0, "0", 1.0, 1.0,
                          0.1, [], signal, groups)
    assert zero_signal(report(1, 2)) is None and zero_signal(report(0, 0)) is None
    line = zero_signal(report(0, 2))
    assert line is not None and line.startswith("polar train: step 3: no signal: in each of the 2 groups every "
                                                "sample scored the same (mean reward 1)")
