"""shared_prefix.py + the shared references of captures.py / capture_reader.py: sessions whose first calls share a
long prefix (a harness's system prompt and tools) store it once in `<capture_dir>/_shared/`."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from polar_traj.capture_reader import read_capture
from polar_traj.captures import MIN_SHARED, CaptureWriter, copy_capture, shared_files
from polar_traj.reading import read_session, scan

SYSTEM_IDS = [1000 + (i * 7919) % 140_000 for i in range(5000)]  # the harness's rendered system prompt and tools
SYSTEM = "You are a coding agent. Follow the rules. " * 400
TOOLS = [{"type": "function", "function": {"name": f"tool{i}", "description": "d" * 2000}} for i in range(10)]


def harness_session(make_record, n: int, turns: int = 3, api: str = "openai_chat") -> list:
    """An agent session of the harness: the same system prompt and tools, then its own task and turns."""
    records, prompt = [], SYSTEM_IDS + [50 + n] * 30
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"task {n}"}]
    for t in range(turns):
        out = [300 + t, 301 + n, 99]
        request = {"model": "tiny", "messages": list(messages), "tools": TOOLS, "stream": False}
        records.append(make_record(prompt, out, call_id=f"s{n}-c{t}", session_id=f"s{n}", request=request, api=api,
                                   parent_call_id=f"s{n}-c{t - 1}" if t else None))
        prompt = prompt + out + [400 + t] * 40
        messages += [{"role": "assistant", "content": f"turn {t}"}, {"role": "user", "content": f"tool out {t}"}]
    return records


def write(capture: Path, records, shared: bool = True) -> None:
    writer = CaptureWriter(capture, shared=shared, fsync=False)
    for r in records:
        writer.write(r)


def first_lines(capture: Path, sessions: int) -> list[dict]:
    return [json.loads((capture / "task" / f"s{n}.jsonl").read_text().splitlines()[0]) for n in range(sessions)]


def test_sessions_2_to_n_refer_to_one_shared_prefix_and_read_back_exactly(capture, make_record):
    sessions = [harness_session(make_record, n) for n in range(6)]
    write(capture, [r for s in sessions for r in s])
    for n, records in enumerate(sessions):
        got = list(read_capture(capture / "task" / f"s{n}.jsonl"))
        assert got == records
        assert [list(r.request) for r in got] == [list(r.request) for r in records]  # key order kept
    (shared,) = (capture / "_shared").iterdir()
    assert shared.name == hashlib.blake2b(shared.read_bytes(), digest_size=16).hexdigest() + ".json"
    first = first_lines(capture, 6)
    assert "prompt_prefix" not in first[0]  # nothing to share with yet: self-contained
    for line in first[1:]:
        assert line["prompt_prefix"] == {"shared": shared.stem, "length": len(SYSTEM_IDS)}
        assert line["request_base"]["shared"] == shared.stem and line["request_base"]["same"] == ["tools"]
        assert line["request_base"]["extend"] == {"messages": 1}
    sizes = [len((capture / "task" / f"s{n}.jsonl").read_bytes().split(b"\n")[0]) for n in range(6)]
    assert max(sizes[1:]) * 20 < sizes[0]
    body = json.loads(shared.read_bytes())
    assert body["shared_version"] == 1 and body["ids"] == SYSTEM_IDS and body["api"] == "openai_chat"
    assert body["request"] == {"messages": [sessions[0][0].request["messages"][0]], "tools": TOOLS}
    assert shared_files(capture / "task" / "s3.jsonl") == [shared] and shared_files(capture / "task" / "s0.jsonl") == []
    (sf, *_) = scan(capture)  # the _shared folder is no task: scan finds only the sessions
    assert len(scan(capture)) == 6 and read_session(sf, payloads=True).records == sessions[0]


def test_a_shared_prefix_is_not_used_below_min_shared_or_across_apis_or_without_shared(tmp_path, make_record):
    short = [make_record(list(range(1, MIN_SHARED - 10)) + [n], [99], call_id=f"c{n}", session_id=f"s{n}")
             for n in range(3)]
    write(tmp_path / "short", short)
    assert not (tmp_path / "short" / "_shared").exists()
    write(tmp_path / "plain", harness_session(make_record, 0) + harness_session(make_record, 1), shared=False)
    assert not (tmp_path / "plain" / "_shared").exists()
    mixed = harness_session(make_record, 0) + harness_session(make_record, 1, api="anthropic")
    write(tmp_path / "apis", mixed)
    assert not (tmp_path / "apis" / "_shared").exists()
    assert [r for n in range(2) for r in read_capture(tmp_path / "apis" / "task" / f"s{n}.jsonl")] == mixed


def test_a_missing_or_changed_shared_file_fails_naming_line_call_and_file(capture, make_record):
    s0 = harness_session(make_record, 0)
    write(capture, s0 + harness_session(make_record, 1))
    path = capture / "task" / "s1.jsonl"
    (shared,) = shared_files(path)
    data = shared.read_bytes()
    shared.write_bytes(data.replace(b"[1000,", b"[1001,", 1))
    with pytest.raises(ValueError, match=rf"s1\.jsonl:1: call s1-c0: prompt_prefix refers to shared prefix "
                                         rf"'{shared.stem}', whose file does not match its digest.*{shared.name}"):
        list(read_capture(path))
    shared.unlink()
    with pytest.raises(ValueError, match=rf"s1\.jsonl:1: call s1-c0: .*which is missing: .*_shared/{shared.name}"):
        list(read_capture(path))
    lenient = read_session(scan(capture, session_id="s1")[0], strict=False)
    assert lenient.records == [] and "which is missing" in lenient.problems[0]  # later lines build on it
    assert list(read_capture(capture / "task" / "s0.jsonl")) == s0


def test_a_reference_naming_no_digest_or_both_is_refused(capture, make_record):
    write(capture, harness_session(make_record, 0, turns=1) + harness_session(make_record, 1, turns=1))
    path = capture / "task" / "s1.jsonl"
    text = path.read_text()
    digest = shared_files(path)[0].stem
    path.write_text(text.replace(f'"shared":"{digest}","length"', '"shared":"../../etc/passwd","length"'))
    with pytest.raises(ValueError, match=r"names no shared prefix \('\.\./\.\./etc/passwd' is not a digest\)"):
        list(read_capture(path))
    path.write_text(text.replace(f'"shared":"{digest}","length"', f'"shared":"{digest}","call_id":"x","length"'))
    with pytest.raises(ValueError, match="names both a call and a shared prefix"):
        list(read_capture(path))


def test_copy_and_move_carry_the_shared_files_along(tmp_path, make_record):
    sessions = [harness_session(make_record, n) for n in range(3)]
    write(tmp_path / "proxy", [r for s in sessions for r in s])
    src = tmp_path / "proxy" / "task" / "s1.jsonl"
    copied = copy_capture(src, tmp_path / "run" / "captures" / "task" / "s1.jsonl")
    assert list(read_capture(copied)) == sessions[1] and src.exists()
    assert [p.name for p in (tmp_path / "run" / "captures" / "_shared").iterdir()] == [shared_files(src)[0].name]
    copy_capture(src, copied)  # again: the shared file already there is kept
    moved = copy_capture(tmp_path / "proxy" / "task" / "s2.jsonl",
                         tmp_path / "attempt" / "abandoned-captures" / "task" / "s2.jsonl", move=True)
    assert list(read_capture(moved)) == sessions[2] and not (tmp_path / "proxy" / "task" / "s2.jsonl").exists()
    assert list(read_capture(src)) == sessions[1]  # the shared file stays for the sessions left behind


def test_the_memory_bound_counts_shared_prefixes(tmp_path, make_record):
    writer = CaptureWriter(tmp_path, shared=True, fsync=False, max_bytes=600_000)
    for n in range(12):
        prompt = [n + 1] * 2000 + SYSTEM_IDS[:2000]  # twelve prompts, each shared by a pair of sessions
        for k in range(2):
            writer.write(make_record(prompt + [7] * k, [99], call_id=f"c{n}-{k}", session_id=f"s{n}-{k}"))
            assert writer._bytes + writer._shared_bytes <= 600_000 + 60_000  # at most the newest past the bound
    assert len(list((tmp_path / "_shared").iterdir())) == 12  # each pair still found its shared prefix
    assert len(writer._prefixes) < 12


cuts = st.lists(st.tuples(st.integers(0, 2), st.integers(0, 3000), st.integers(0, 3)), min_size=1, max_size=8)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=cuts)
def test_any_sessions_sharing_prefixes_read_back_exactly(tmp_path_factory, make_record, steps):
    """First calls of sessions that share some of one of three long prompts (cut anywhere), then a second call."""
    bases = [SYSTEM_IDS[:3000], SYSTEM_IDS[:1500] + [5] * 1500, [6] * 3000]
    records = []
    for n, (pick, cut, msgs) in enumerate(steps):
        prompt = bases[pick][:cut] + [10 + n] * 5
        request = {"model": "tiny", "messages": [{"role": "user", "content": SYSTEM}] * msgs + [{"role": "user"}],
                   "tools": TOOLS[:pick]}
        first = make_record(prompt, [99], call_id=f"c{n}", session_id=f"s{n}", request=request)
        second = make_record(prompt + [99, 8], [99], call_id=f"d{n}", session_id=f"s{n}", parent_call_id=f"c{n}",
                             request={**request, "messages": request["messages"] + [{"role": "tool"}]})
        records += [first, second]
    root = tmp_path_factory.mktemp("cap")
    write(root, records)
    assert [r for n in range(len(steps)) for r in read_capture(root / "task" / f"s{n}.jsonl")] == records


def test_a_sessions_later_call_may_refer_to_a_shared_prefix(capture, make_record):
    """A session whose first line is a short side call (a title) and whose agent call then starts with the
    harness's shared prompt: that second line refers to the shared file, is written once, and reads back."""
    first = harness_session(make_record, 0, turns=1)
    title = make_record([7, 8, 9] * 20, [5, 99], call_id="s1-title", session_id="s1",
                        request={"model": "tiny", "messages": [{"role": "user", "content": "name this chat"}]})
    agent = harness_session(make_record, 1, turns=2)
    write(capture, first + [title] + agent)
    lines = [json.loads(line) for line in (capture / "task" / "s1.jsonl").read_text().splitlines()]
    assert [line["call_id"] for line in lines] == ["s1-title", "s1-c0", "s1-c1"]  # each once
    assert "shared" in lines[1]["prompt_prefix"] and "shared" in lines[1]["request_base"]
    assert list(read_capture(capture / "task" / "s1.jsonl")) == [title] + agent
