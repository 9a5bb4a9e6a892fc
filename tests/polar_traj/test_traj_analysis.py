"""analysis.py: pandas answers about a built file."""
from __future__ import annotations

import pytest

from polar_traj import analysis
from polar_traj.build import BuildConfig
from polar_traj.parquet import read
from polar_traj.pipeline import Selection, build_parquet


def test_rewards_by_harness(dataset):
    df = analysis.rewards_by_harness(dataset)
    assert list(df.index) == ["claude", "codex"]
    assert df.loc["codex", "trajectories"] == 1 and df.loc["codex", "reward_mean"] == 1.0
    assert df.loc["claude", "sessions"] == 2 and df.loc["claude", "rewarded"] == 1
    assert df.loc["claude", "success_rate"] == 0.0 and df.loc["codex", "success_rate"] == 1.0
    assert df.loc["claude", "status_error"] == 1 and df.loc["claude", "status_completed"] == 1


def test_turns_and_tokens(dataset):
    df = analysis.turns_and_tokens(read(dataset)).set_index("session_id")
    assert df.loc["s1", "turns"] == 3 and df.loc["s2", "turns"] == 2
    assert df.loc["s1", "trained_tokens"] == 9  # three sampled turns of 3 tokens
    assert df.loc["s3", "trained_tokens"] == 0  # infrastructure error: masked
    assert df.loc["s1", "total_tokens"] == df.loc["s1", "prompt_len"] + df.loc["s1", "response_len"]
    assert df.loc["s1", "per_request_tokens"] == 48 and df.loc["s1", "harness"] == "codex"


def test_merge_stats_per_strategy(capture, write_records, chain_session, make_record, tmp_path):
    calls = chain_session(3, session_id="a")
    rerendered = make_record(list(calls[0].prompt_ids) + [200, 77, 78, 99, 500], [300, 99], call_id="r",
                             session_id="a")
    write_records(capture, calls + [rerendered])
    out = tmp_path / "parts"
    out.mkdir()
    build_parquet(Selection(capture), out)
    build_parquet(Selection(capture), out, BuildConfig(strategy="per_request"))
    df = analysis.merge_stats(out)
    merged, plain = df.loc["prefix_merge"], df.loc["per_request"]
    assert (merged["calls"], merged["trajectories"], merged["calls_merged"]) == (4, 2, 2)
    assert (merged["new"], merged["break"], merged["break_retokenized"]) == (1, 1, 1)
    assert (plain["calls"], plain["trajectories"], plain["calls_merged"]) == (4, 4, 0)
    assert merged["per_request_tokens"] == plain["tokens"] == plain["per_request_tokens"]
    assert merged["tokens_saved"] == merged["per_request_tokens"] - merged["tokens"] > 0
    assert merged["token_ratio"] == pytest.approx(merged["per_request_tokens"] / merged["tokens"])


def test_summary(dataset):
    s = analysis.summary(dataset)
    assert (s["trajectories"], s["sessions"], s["tasks"], s["groups"]) == (3, 3, 1, 1)
    assert s["statuses"] == {"completed": 2, "error": 1} and s["masked"] == 1 and s["logprobs_incomplete"] == 1
    assert s["rewarded"] == 2 and s["reward_mean"] == 0.5
