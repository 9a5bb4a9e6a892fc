"""reading.py: scanning capture directories, streaming sessions, validating records."""
from __future__ import annotations

import json

import pytest

from polar_traj.reading import iter_sessions, read_session, scan


def test_scan_root_task_dir_and_single_file(capture, write_records, make_record):
    write_records(capture, [make_record([1], [2], task_id="t2", session_id="b"),
                            make_record([1], [2], task_id="t1", session_id="z"),
                            make_record([1], [2], task_id="t1", session_id="a")])
    assert [(f.task_id, f.session_id) for f in scan(capture)] == [("t1", "a"), ("t1", "z"), ("t2", "b")]
    assert [f.session_id for f in scan(capture / "t1")] == ["a", "z"]
    assert [(f.task_id, f.session_id) for f in scan(capture / "t2" / "b.jsonl")] == [("t2", "b")]
    assert [f.session_id for f in scan(capture, task_id="t1", session_id="z")] == ["z"]
    with pytest.raises(FileNotFoundError):
        scan(capture / "nope")


def test_payloads_dropped_then_read_back(capture, write_records, make_record):
    r = make_record([1, 2], [3], call_id="c0", request={"messages": [{"role": "user", "content": "x"}]},
                    response={"choices": []})
    write_records(capture, [make_record([1], [2], call_id="first"), r])
    (sf,) = scan(capture)
    session = read_session(sf)
    assert [x.call_id for x in session.records] == ["first", "c0"]
    assert session.records[1].request == {} and session.records[1].response is None
    assert session.payload("c0") == (r.request, r.response)
    assert read_session(sf, payloads=True).records[1].request == r.request


def test_torn_last_line_is_skipped(capture, write_records, make_record):
    write_records(capture, [make_record([1], [2], call_id="ok")])
    (sf,) = scan(capture)
    with open(sf.path, "a") as f:
        f.write('{"call_id": "torn", "prom')
    assert [r.call_id for r in read_session(sf).records] == ["ok"]


def test_bad_line_raises_with_its_place_or_is_skipped(capture, write_records, make_record):
    write_records(capture, [make_record([1], [2], call_id="a")])
    (sf,) = scan(capture)
    with open(sf.path, "a") as f:
        f.write("not json\n")
    write_records(capture, [make_record([1], [2], call_id="b")])
    with pytest.raises(ValueError, match=r"sess.jsonl:2: not a JSON record"):
        read_session(sf)


@pytest.mark.parametrize("change, message", [
    ({"session_id": "other"}, "its file is task/sess"),
    ({"call_id": "a"}, "duplicate call_id a"),
    ({"prompt_ids": [1, -4]}, "negative token id"),
    ({"output_ids": [2**31]}, "token id above"),
    ({"prompt_ids": []}, "no prompt_ids"),
    ({"output_logprobs": [0.5, 0.5]}, "2 logprobs"),
    ({"api": "cohere"}, "unknown api"),
])
def test_invalid_records(capture, write_records, make_record, change, message):
    write_records(capture, [make_record([1], [2], call_id="a")])
    (sf,) = scan(capture)
    bad = json.loads(make_record([1], [2], call_id="b").to_json())
    bad.update(change)
    with open(sf.path, "a") as f:
        f.write(json.dumps(bad) + "\n")
    with pytest.raises(ValueError, match=message):
        read_session(sf)
    lenient = read_session(sf, strict=False)
    assert [r.call_id for r in lenient.records] == ["a"] and message in lenient.problems[0]


def test_sessions_are_read_one_at_a_time(capture, write_records, make_record):
    write_records(capture, [make_record([1], [2], session_id="s1"), make_record([1], [2], session_id="s2")])
    files = scan(capture)
    sessions = iter_sessions(files)
    assert next(sessions).session_id == "s1"
    files[1].path.write_text("garbage\n")  # not read yet: a lazy reader only fails when it gets there
    with pytest.raises(ValueError):
        next(sessions)


@pytest.mark.parametrize("strategy", ["prefix_merge", "per_request"])
def test_linear_captures_build_the_same_trajectories(tmp_path, chain_session, make_record, write_records, strategy):
    """The same sessions written in format 1 and in the linear form give the same Parquet rows."""
    from polar_traj.build import BuildConfig
    from polar_traj.captures import CaptureWriter
    from polar_traj.parquet import read
    from polar_traj.pipeline import Selection, build_parquet

    main = chain_session(6, session_id="s1", system=tuple(range(1, 60)))
    side = make_record(list(range(1, 60)) + [7], [8, 99], call_id="side", session_id="s1", started_at=2.5)
    records = main[:3] + [side] + main[3:] + chain_session(2, session_id="s2", system=tuple(range(1, 60)))
    write_records(tmp_path / "f1", records)
    writer = CaptureWriter(tmp_path / "linear")
    for r in records:
        writer.write(r)
    assert '"prompt_prefix"' in (tmp_path / "linear" / "task" / "s1.jsonl").read_text()
    rows = {}
    for form in ("f1", "linear"):
        build_parquet(Selection(tmp_path / form), tmp_path / f"{form}.parquet", BuildConfig(strategy=strategy))
        rows[form] = read(tmp_path / f"{form}.parquet").to_pylist()
    assert rows["linear"] == rows["f1"] and len(rows["f1"]) >= 2


def test_responses_kept_and_payloads_read_without_the_prompt(capture, write_records, make_record):
    """A format-1 session read without payloads keeps each response (no re-read); a payload re-read cuts
    out the record's own prompt_ids, also when the request holds a `prompt_ids` key written before it."""
    r = make_record(list(range(1, 300)), [7], call_id="c0", response={"choices": [{"message": {"content": "a"}}]})
    write_records(capture, [r])
    (sf,) = scan(capture)
    request = {"prompt_ids": [5, 6], "messages": [{"role": "user", "content": 'say "prompt_ids": [1]'}]}
    data = {"request": request, **json.loads(r.to_json()), "response": {"id": "x"}}
    data["request"] = request  # keeps its place, first in the line
    with open(sf.path, "a") as f:
        f.write(json.dumps({**data, "call_id": "c1"}) + "\n")
    session = read_session(sf)
    assert session.responses == {"c0": r.response, "c1": {"id": "x"}}
    assert session.payload("c1") == (request, {"id": "x"}) and session.payload("c0") == (r.request, r.response)
    sf.path.unlink()
    assert session.response("c0") == r.response  # kept from the first read: the file is not opened again
