"""captures.py + capture_reader.py: the linear capture form (format 2) and reading both formats back exactly."""
from __future__ import annotations

import dataclasses
import json
from array import array
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from polar_traj.captures import CaptureWriter
from polar_traj.reading import read_session, scan
from polar_traj.capture_reader import read_capture
from polar_traj.records import append_record

SYSTEM = "You are a coding agent. Follow the rules. " * 40
TOOLS = [{"type": "function", "function": {"name": f"tool{i}", "description": "d" * 300,
                                           "parameters": {"type": "object", "properties": {"$ref": "#/x"}}}}
         for i in range(5)]


def agent_session(make_record, turns: int, session_id: str = "sess") -> list:
    """An agent loop whose prompt ids and chat request both grow by one turn per call."""
    records, prompt = [], list(range(1, 201))
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "fix the bug"}]
    for n in range(turns):
        out = [300 + n, 301 + n, 99]
        request = {"model": "tiny", "messages": list(messages), "tools": TOOLS, "stream": False}
        records.append(make_record(prompt, out, call_id=f"c{n}", session_id=session_id, request=request,
                                   response={"choices": [{"message": {"content": f"turn {n}"}}]},
                                   parent_call_id=f"c{n - 1}" if n else None))
        prompt = prompt + out + [400 + n] * 40
        messages += [{"role": "assistant", "content": f"turn {n}"}, {"role": "user", "content": f"tool out {n}"}]
    return records


def write_linear(capture: Path, records) -> Path:
    writer = CaptureWriter(capture)
    paths = {writer.write(r) for r in records}
    return paths.pop() if len(paths) == 1 else capture


def lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def test_linear_round_trip_is_exact_and_grows_with_new_content_only(capture, make_record):
    records = agent_session(make_record, 20)
    path = write_linear(capture, records)
    assert list(read_capture(path)) == records
    got = list(read_capture(path))
    assert [list(r.request) for r in got] == [list(r.request) for r in records]  # key order kept
    raw = lines(path)
    assert all(x["capture_version"] == 2 for x in raw)
    assert raw[5]["prompt_prefix"] == {"call_id": "c4", "length": len(records[4].prompt_ids) + 3}
    assert raw[5]["prompt_ids"] == [404] * 40
    assert raw[5]["request_base"]["same"] == ["tools"] and raw[5]["request_base"]["extend"] == {"messages": 10}
    sizes = [len(x) for x in path.read_bytes().splitlines()]
    assert sizes[-1] < 1.2 * sizes[2]  # a later line is no bigger than an early one: linear growth
    full = capture / "v1"
    for r in records:
        append_record(full, r)
    assert path.stat().st_size * 5 < (full / "task" / "sess.jsonl").stat().st_size


def test_side_calls_and_forks_reference_the_right_call(capture, make_record):
    main = agent_session(make_record, 4)
    title = make_record(list(range(900, 960)), [5, 99], call_id="title", request={"model": "tiny", "messages": []})
    retry = make_record(main[2].prompt_ids, [7, 8, 99], call_id="retry", request=main[2].request)
    records = [main[0], title, main[1], main[2], retry, main[3]]
    path = write_linear(capture, records)
    assert list(read_capture(path)) == records
    raw = {x["call_id"]: x for x in lines(path)}
    assert "prompt_prefix" not in raw["title"]  # shares nothing: stored whole
    assert raw["retry"]["prompt_prefix"]["length"] == len(main[2].prompt_ids) and raw["retry"]["prompt_ids"] == []
    assert raw["c3"]["prompt_prefix"]["call_id"] == "c2"  # the parent, not the later retry


def test_old_format_and_mixed_files_read_back(capture, make_record):
    records = agent_session(make_record, 6)
    for r in records[:3]:
        append_record(capture, r)  # format 1, as an older proxy wrote it
    path = write_linear(capture, records[3:])  # a new proxy appends to the same session
    assert "capture_version" not in lines(path)[0] and "prompt_prefix" not in lines(path)[3]
    assert list(read_capture(path)) == records
    (sf,) = scan(capture)
    session = read_session(sf)
    assert [r.prompt_ids for r in session.records] == [r.prompt_ids for r in records]
    assert session.payload("c1") == (records[1].request, records[1].response)  # re-read from its line
    assert session.payload("c5") == (records[5].request, records[5].response)  # rebuilt in memory


def test_missing_parent_line_fails_naming_file_and_call(capture, make_record):
    path = write_linear(capture, agent_session(make_record, 3))
    kept = [x for x in path.read_text().splitlines() if '"call_id":"c1"' not in x.split(',"task_id"')[0]]
    path.write_text("\n".join(kept) + "\n")
    with pytest.raises(ValueError, match=r"sess\.jsonl:2: call c2: prompt_prefix refers to call 'c1'.*sess\.jsonl"):
        list(read_capture(path))
    (sf,) = scan(capture)
    with pytest.raises(ValueError, match="call c2: prompt_prefix refers to call 'c1'"):
        read_session(sf)
    lenient = read_session(sf, strict=False)
    assert [r.call_id for r in lenient.records] == ["c0"] and "refers to call 'c1'" in lenient.problems[0]


def test_torn_last_linear_line_is_skipped(capture, make_record):
    records = agent_session(make_record, 3)
    path = write_linear(capture, records)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 40])  # the writer died inside the last line
    assert list(read_capture(path)) == records[:2]


def test_unknown_capture_version_is_refused(capture, make_record):
    path = write_linear(capture, agent_session(make_record, 1))
    path.write_text(path.read_text().replace('"capture_version":2', '"capture_version":3'))
    with pytest.raises(ValueError, match=r"sess\.jsonl:1: capture_version 3: this reader knows 1 and 2"):
        list(read_capture(path))


def test_lone_surrogates_stay_valid_utf8_lines(capture, make_record):
    broken = "tool output \udc80 cut"
    records = agent_session(make_record, 2)
    records[1] = make_record(records[1].prompt_ids, [5, 99], call_id="c1", request={"messages": [broken]})
    path = write_linear(capture, records)
    path.read_bytes().decode("utf-8")  # every line is valid UTF-8
    assert list(read_capture(path))[1].request == {"messages": [broken]}


def test_a_new_writer_or_a_replaced_file_starts_self_contained(capture, make_record):
    records = agent_session(make_record, 4)
    path = write_linear(capture, records[:2])
    write_linear(capture, records[2:3])  # a restarted proxy: it never wrote c1 itself
    assert "prompt_prefix" not in lines(path)[2]
    writer = CaptureWriter(capture)
    writer.write(records[0])
    path.unlink()  # the file is gone under the writer: c0 cannot be referred to any more
    writer.write(records[1])
    assert "prompt_prefix" not in lines(path)[0] and list(read_capture(path)) == records[1:2]


def test_format1_prompt_text_elsewhere_in_the_line_is_not_taken_for_the_prompt(capture, make_record):
    tricky = {"messages": [{"role": "user", "content": [{"type": "tool_use", "input": {"prompt_ids": [7, 7]}}]}]}
    a = make_record(list(range(1, 50)), [3, 99], call_id="a", request=tricky)
    b = make_record(list(range(1, 50)) + [3, 99, 5], [4, 99], call_id="b", request=tricky)
    path = capture / "task" / "sess.jsonl"
    path.parent.mkdir(parents=True)
    moved = {"request": tricky, **{k: v for k, v in json.loads(b.to_json()).items() if k != "request"}}
    path.write_text(a.to_json() + "\n" + json.dumps(moved) + "\n")
    assert list(read_capture(path)) == [a, b]


@pytest.mark.parametrize("separators", [(",", ":"), (", ", ": ")])
def test_format1_payloads_read_back_whatever_their_keys(capture, make_record, separators):
    """Without payloads a format-1 line's request is skipped unparsed; keys named like record fields inside
    the request or response must not confuse that."""
    request = {"messages": [{"role": "user", "content": 'say "response": 1'}], "response": {"request": 2}}
    response = {"type": "response.completed", "response": {"id": "r", "output": [], "request": None}}
    records = [make_record(list(range(1, 60)) + [n], [3, 99], call_id=f"c{n}", request=request, response=response)
               for n in range(3)]
    path = capture / "task" / "sess.jsonl"
    path.parent.mkdir(parents=True)
    path.write_text("".join(json.dumps(json.loads(r.to_json()), separators=separators) + "\n" for r in records))
    (sf,) = scan(capture)
    session = read_session(sf)
    assert [r.prompt_ids for r in session.records] == [r.prompt_ids for r in records]
    assert session.records[0].request == {} and session.payload("c2") == (request, response)
    assert read_session(sf, payloads=True).records == records


ids = st.lists(st.integers(0, 50), max_size=12)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(st.tuples(st.integers(0, 9), st.integers(0, 40), ids, ids), min_size=1, max_size=12))
def test_any_session_reads_back_exactly_in_both_formats(tmp_path_factory, make_record, steps):
    """Each call extends (part of) an earlier call's ids, or starts fresh; both formats give them back."""
    records, msgs = [], []
    for n, (pick, cut, new, out) in enumerate(steps):
        base = records[pick % len(records)] if records and pick else None
        head = (base.prompt_ids + base.output_ids)[:cut * 3] if base else ()
        prompt = list(head) + new + [1] * 40 if not head and not new else list(head) + new
        msgs = msgs[: pick % 4] + [{"role": "user", "content": f"m{n}"}]
        records.append(make_record(prompt or [1], out, call_id=f"c{n}",
                                   request={"messages": list(msgs), "tools": TOOLS[: pick % 3]}))
    root = tmp_path_factory.mktemp("cap")
    linear = write_linear(root / "linear", records)
    for r in records:
        append_record(root / "full", r)
    assert list(read_capture(linear)) == records
    assert list(read_capture(root / "full" / "task" / "sess.jsonl")) == records


def test_a_vouched_extension_is_written_the_same_and_a_false_one_is_not_trusted(capture, make_record):
    records = agent_session(make_record, 4)
    writer = CaptureWriter(capture / "vouched")
    for prev, r in zip([None] + records, records):
        writer.write(r, extends=len(prev.prompt_ids) + len(prev.output_ids) if prev else None)
    plain = write_linear(capture / "plain", records)
    vouched = capture / "vouched" / "task" / "sess.jsonl"
    assert lines(vouched) == lines(plain) and list(read_capture(vouched)) == records
    ids = list(records[3].prompt_ids + records[3].output_ids)
    ids[-2] = 7  # the prompt does not extend c3 after all
    liar = make_record(ids + [5] * 10, [9, 99], call_id="liar", parent_call_id="c3")
    writer.write(liar, extends=len(ids))  # the seam check catches it: the ids are compared in full
    assert list(read_capture(vouched))[-1] == liar


def test_prompt_ids_as_the_proxys_int32_arrays_are_written_as_tuples_are(capture, make_record):
    """The proxy hands a substituted prompt's ids as an array('i') (no Python int per id): every writer, linear
    with or without a vouched extension and the one-line-per-record form, writes the bytes a tuple gives."""
    records = agent_session(make_record, 5)
    arrays = [dataclasses.replace(r, prompt_ids=array("i", r.prompt_ids)) for r in records]
    writer = CaptureWriter(capture / "arrays")
    for prev, r in zip([None] + arrays, arrays):
        writer.write(r, extends=len(prev.prompt_ids) + len(prev.output_ids) if prev else None)
    got = capture / "arrays" / "task" / "sess.jsonl"
    assert got.read_bytes() == write_linear(capture / "tuples", records).read_bytes()
    assert list(read_capture(got)) == records  # read back as tuples
    for r in arrays:
        append_record(capture / "v1", r)
    assert [json.loads(x)["prompt_ids"] for x in (capture / "v1" / "task" / "sess.jsonl").read_text().splitlines()] \
        == [list(r.prompt_ids) for r in records]
    assert json.loads(arrays[2].to_json())["prompt_ids"] == list(records[2].prompt_ids)


def test_a_writer_with_a_memory_bound_forgets_the_least_recent_sessions(tmp_path):
    from polar_traj.records import CallRecord

    writer = CaptureWriter(tmp_path, max_bytes=200_000)
    big = {"messages": [{"role": "user", "content": "x" * 50_000}]}
    for n in range(10):
        writer.write(CallRecord(f"c{n}", "t", f"s{n}", "openai_chat", "m", False, 0.0, 1.0, 1.0, None,
                                tuple(range(100)), (1, 2), (-0.1, -0.2), "stop", "rendered:first_call", None,
                                big, None))
        assert writer._bytes <= 200_000 + 60_000  # at most the newest session past the bound
    assert len(writer._sessions) < 10 and ("t", "s9") in writer._sessions
    assert [list(read_capture(tmp_path / "t" / f"s{n}.jsonl"))[0].request for n in range(10)] == [big] * 10


def test_a_failed_batch_leaves_none_of_its_lines_and_the_session_goes_on(capture, make_record):
    """The writer reports every line of a session's batch failed when one fails: none of them stays on disk,
    so the caller's error record for a call is never a second line with its id."""
    writer = CaptureWriter(capture, fsync=False)
    writer.write(make_record([1, 2, 3], [4], call_id="a", session_id="s"))
    good = make_record([1, 2, 3, 4, 5], [6], call_id="b", session_id="s")
    bad = make_record([9], [8], call_id="c", session_id="s", request={"model": "m", "x": {1, 2}})  # a set: no JSON
    results = writer.write_many([(good, None), (bad, None)])
    assert all(isinstance(r, Exception) for r in results)
    path = capture / "task" / "s.jsonl"
    assert [r.call_id for r in read_capture(path)] == ["a"]
    writer.write(good)
    assert [r.call_id for r in read_capture(path)] == ["a", "b"]
