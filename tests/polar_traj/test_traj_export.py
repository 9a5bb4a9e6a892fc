"""export.py: slime Samples, the verl padded batch and SFT messages, from a built file."""
from __future__ import annotations

import json

import numpy as np
import pytest

from polar_traj.build import BuildConfig
from polar_traj.export import slime_samples, verl_batch, write_export
from polar_traj.parquet import read
from polar_traj.pipeline import Selection, build_parquet


def test_slime_samples(dataset):
    table = read(dataset)
    rows = {r["session_id"]: r for r in table.to_pylist()}
    samples = {s["metadata"]["session_id"]: s for s in slime_samples(table)}
    s1, s2, s3 = samples["s1"], samples["s2"], samples["s3"]
    assert s1["tokens"] == rows["s1"]["prompt_ids"] + rows["s1"]["response_ids"]
    assert s1["response_length"] == len(rows["s1"]["response_ids"]) == len(s1["loss_mask"])
    assert s1["loss_mask"] == rows["s1"]["loss_mask"] and s1["rollout_log_probs"] == rows["s1"]["logprobs"]
    assert (s1["reward"], s1["status"], s1["prompt"]) == (1.0, "completed", [{"role": "user", "content": "hi"}])
    assert s1["metadata"]["advantage"] == 0.5 and "conversation" not in s1["metadata"]
    assert s2["rollout_log_probs"] is None  # one call had no logprobs: do not pretend
    assert s3["status"] == "aborted" and set(s3["loss_mask"]) == {0}
    assert {s["group_index"] for s in samples.values()} == {0}
    assert sorted(s["index"] for s in samples.values()) == [0, 1, 2]


def test_verl_batch(dataset):
    table = read(dataset)
    batch = verl_batch(table, pad_token_id=7)
    rows = table.to_pylist()
    p = max(len(r["prompt_ids"]) for r in rows)
    r = max(len(r["response_ids"]) for r in rows)
    assert batch["input_ids"].shape == (3, p + r) and batch["response_mask"].shape == (3, r)
    for i, row in enumerate(rows):
        n, m = len(row["prompt_ids"]), len(row["response_ids"])
        assert batch["prompts"][i, p - n:].tolist() == row["prompt_ids"] and set(batch["prompts"][i, :p - n]) <= {7}
        assert batch["responses"][i, :m].tolist() == row["response_ids"]
        assert batch["response_mask"][i].tolist() == row["loss_mask"] + [0] * (r - m)
        assert batch["old_log_probs"][i, :m].tolist() == row["logprobs"]
        assert batch["attention_mask"][i].sum() == n + m
        assert batch["position_ids"][i, p - n] == 0 and batch["position_ids"][i, p + m - 1] == n + m - 1
        reward = row["reward"]
        assert batch["token_level_scores"][i, m - 1] == (0.0 if reward is None else reward)
        assert batch["trajectory_id"][i] == row["trajectory_id"] and batch["uid"][i] == "t"
    assert np.isnan(batch["rewards"][[r["status"] == "error" for r in rows]]).all()
    assert batch["logprobs_complete"].tolist() == [r["session_id"] != "s2" for r in rows]


def test_write_each_format(dataset, tmp_path):
    table = read(dataset)
    slime = write_export(table, "slime", tmp_path / "out" / "slime.jsonl")
    assert slime.written == 3 and len(slime.path.read_text().splitlines()) == 3
    verl = write_export(table, "verl", tmp_path / "verl.npz")
    with np.load(verl.path) as npz:  # no pickle needed
        assert npz["input_ids"].shape[0] == 3 and npz["uid"].dtype.kind == "U"
    sft = write_export(table, "sft", tmp_path / "sft.jsonl")
    lines = [json.loads(x) for x in sft.path.read_text().splitlines()]
    s1 = next(x for x in lines if x["session_id"] == "s1")
    assert s1["messages"] == [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "turn 2"}]
    assert (s1["api"], s1["reward"], s1["status"], s1["tools"]) == ("openai_chat", 1.0, "completed", [])
    assert not list(tmp_path.glob(".*.tmp"))


def test_sft_skips_rows_built_without_conversation(capture, write_records, chain_session, tmp_path):
    write_records(capture, chain_session(2))
    build_parquet(Selection(capture), tmp_path / "t.parquet", BuildConfig(keep_conversation=False))
    result = write_export(read(tmp_path / "t.parquet"), "sft", tmp_path / "sft.jsonl")
    assert (result.written, result.skipped) == (0, 1)


def test_unknown_format(dataset, tmp_path):
    with pytest.raises(ValueError, match="format"):
        write_export(read(dataset), "megatron", tmp_path / "x")


def test_accepted_rows_for_rejection_sampling(dataset, tmp_path, capsys):
    from polar.cli import main
    from polar_traj.export import accepted

    table = read(dataset)
    rows = table.to_pylist()
    good = {r["session_id"] for r in rows if r["reward"] is not None and r["reward"] >= 1.0 and r["weight"] > 0}
    assert {r["session_id"] for r in accepted(table, 1.0).to_pylist()} == good and good
    assert {r["status"] for r in accepted(table, statuses=("error",)).to_pylist()} <= {"error"}
    assert accepted(table).num_rows == table.num_rows
    out = tmp_path / "sft.jsonl"
    assert main(["traj", "export", str(dataset), "--format", "sft", "--min-reward", "1", "--status", "completed",
                 "-o", str(out)]) == 0
    assert f"accepted {len(good)}/{len(rows)} trajectories" in capsys.readouterr().out
    assert all(json.loads(line)["reward"] >= 1.0 for line in out.read_text().splitlines())
