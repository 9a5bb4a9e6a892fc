"""pipeline.py end to end: the Parquet table of a generated capture, in both capture forms, equals a
straightforward reconstruction from read_capture, row by row (catches a wrong offset or a reused prefix
that is not one), and the build leaves the garbage collector as it found it."""
from __future__ import annotations

import gc
import random
from pathlib import Path

import pytest

from polar_traj.build import BuildConfig
from polar_traj.capture_reader import read_capture
from polar_traj.captures import CaptureWriter
from polar_traj.parquet import read
from polar_traj.pipeline import Selection, build_parquet
from polar_traj.records import CallRecord

EOT = 2
TOKEN_COLUMNS = ("prompt_ids", "response_ids", "loss_mask", "logprobs", "call_ids")


def agent_session(rng: random.Random, task_id: str, session_id: str, turns: int, make_record) -> list[CallRecord]:
    """A title call, then an agent loop whose prompts grow by each output and tool result; every few turns a
    side call on the full history (a fork), a retry of the same prompt, a failed call, a call without logprobs."""
    def tokens(n: int) -> list[int]:
        return [rng.randrange(3, 32000) for _ in range(n)]

    def call(call_id: str, prompt: list[int], output: list[int], **kw) -> CallRecord:
        return make_record(prompt, output, call_id=call_id, task_id=task_id, session_id=session_id, **kw)

    records = [call("title", tokens(30), tokens(5) + [EOT])]
    prompt = tokens(300) + tokens(rng.randrange(20, 60))
    for n in range(turns):
        output = tokens(rng.randrange(5, 40)) + [EOT]
        if n % 4 == 1:
            records.append(call(f"retry{n}", prompt, tokens(7) + [EOT]))
        if n % 5 == 2:
            records.append(call(f"failed{n}", prompt, [], logprobs=(), error="engine answered 500"))
        records.append(call(f"c{n}", prompt, output, logprobs=() if n == 3 else output_logprobs(output)))
        if n % 4 == 3:
            records.append(call(f"side{n}", prompt + output + tokens(12), tokens(9) + [EOT]))
        prompt = prompt + output + tokens(rng.randrange(10, 120))
    return records


def output_logprobs(output: list[int]) -> tuple[float, ...]:
    return tuple(-(1 + t % 7) / 8 for t in output)  # float32-exact


def expected_per_request(records: list[CallRecord]) -> list[dict]:
    return [{"prompt_ids": list(r.prompt_ids), "response_ids": list(r.output_ids),
             "loss_mask": [1] * len(r.output_ids),
             "logprobs": list(r.output_logprobs) or [0.0] * len(r.output_ids), "call_ids": [r.call_id]}
            for r in records if r.error is None]


def expected_merged(calls: list[CallRecord]) -> dict:
    """One prefix_merge row from its calls, each of which must extend the tokens placed before it."""
    placed = list(calls[0].prompt_ids)
    response, mask, logprobs = [], [], []
    for c in calls:
        assert list(c.prompt_ids[:len(placed)]) == placed
        between = list(c.prompt_ids[len(placed):])
        response += between + list(c.output_ids)
        mask += [0] * len(between) + [1] * len(c.output_ids)
        logprobs += [0.0] * len(between) + (list(c.output_logprobs) or [0.0] * len(c.output_ids))
        placed = list(c.prompt_ids) + list(c.output_ids)
    return {"prompt_ids": list(calls[0].prompt_ids), "response_ids": response, "loss_mask": mask,
            "logprobs": logprobs, "call_ids": [c.call_id for c in calls]}


@pytest.fixture(params=["format1", "linear"])
def generated(request, tmp_path, make_record, write_records) -> tuple[Path, list[list[CallRecord]]]:
    rng = random.Random(7)
    sessions = [agent_session(rng, f"task{k % 2}", f"s{k}", turns, make_record)
                for k, turns in enumerate((14, 3, 9))]
    capture = tmp_path / "capture"
    if request.param == "format1":
        write_records(capture, [r for s in sessions for r in s])
    else:
        writer = CaptureWriter(capture, fsync=False)
        for r in (r for s in sessions for r in s):
            writer.write(r)
    files = sorted(capture.rglob("*.jsonl"))  # scan order: task folder, then session file
    return capture, [list(read_capture(f)) for f in files]


def columns(table) -> list[dict]:
    return [{c: row[c] for c in TOKEN_COLUMNS} for row in table.select(list(TOKEN_COLUMNS)).to_pylist()]


def test_per_request_table_is_each_call_as_read(generated, tmp_path):
    capture, sessions = generated
    build_parquet(Selection(capture), tmp_path / "pr.parquet", BuildConfig(strategy="per_request"))
    table = read(tmp_path / "pr.parquet")
    assert columns(table) == [row for records in sessions for row in expected_per_request(records)]
    assert table.column("prompt_len").to_pylist() == [len(r["prompt_ids"]) for r in columns(table)]


def test_prefix_merge_table_is_its_calls_merged(generated, tmp_path):
    capture, sessions = generated
    build_parquet(Selection(capture), tmp_path / "pm.parquet", BuildConfig(strategy="prefix_merge"))
    table = read(tmp_path / "pm.parquet")
    rows, row_sessions = columns(table), table.column("session_id").to_pylist()
    by_id = {(r.session_id, r.call_id): r for records in sessions for r in records}
    assert rows == [expected_merged([by_id[s, c] for c in row["call_ids"]]) for s, row in zip(row_sessions, rows)]
    # every usable call exactly once, the rows in session order and, within one, by their first call
    order = [(r.session_id, r.call_id) for records in sessions for r in records if r.error is None]
    merged = [(s, c) for s, row in zip(row_sessions, rows) for c in row["call_ids"]]
    assert sorted(merged) == sorted(order)
    firsts = [order.index((s, row["call_ids"][0])) for s, row in zip(row_sessions, rows)]
    assert firsts == sorted(firsts) and len(rows) < len(order)


@pytest.mark.parametrize("enabled", [True, False])
def test_build_leaves_the_collector_as_it_was(tmp_path, make_record, write_records, enabled):
    write_records(tmp_path / "capture", [make_record([1, 2, 3], [4, EOT], call_id="c0")])
    was = gc.isenabled()
    (gc.enable if enabled else gc.disable)()
    try:
        build_parquet(Selection(tmp_path / "capture"), tmp_path / "out.parquet")
        assert gc.isenabled() is enabled
    finally:
        (gc.enable if was else gc.disable)()
