"""workers.sample_flow.abandon: an abandoned attempt's capture moves into the attempt folder and reads back there."""
from __future__ import annotations

import json
from pathlib import Path

from polar_mitm.launch import ProxyProcess
import polar.run.sample
from polar_traj.capture_reader import read_capture
from polar_traj.captures import CaptureWriter
from polar_traj.records import CallRecord
from workers.sample_flow import abandon


def first_call(session_id: str) -> CallRecord:
    return CallRecord(f"{session_id}-c0", "t", session_id, "openai_chat", "m", False, 0.0, 1.0, 1.0, None,
                      tuple(range(1, 2001)) + (7,), (1, 2), (-0.5, -0.25), "stop", "rendered:first_call", None,
                      {"messages": [{"role": "system", "content": "rules " * 100}]}, None)


def test_an_abandoned_capture_moves_with_its_shared_prefix(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(polar.run.sample, "cleanup_sample", lambda attempt: None)  # no sandbox here to stop
    captures = tmp_path / "captures"
    writer = CaptureWriter(captures, shared=True, fsync=False)
    records = [first_call("s1"), first_call("s2")]
    for r in records:
        writer.write(r)
    attempt = tmp_path / "attempt-1"
    attempt.mkdir()
    (attempt / "sample.json").write_text(json.dumps({"session": {"task_id": "t", "session_id": "s2", "token": "x"},
                                                     "proxy": {"capture_dir": str(captures)}}))
    abandon(attempt, ProxyProcess("127.0.0.1", 1, 2, tmp_path / "ca.pem", captures, "open"), "node lost", "node_lost")
    moved = attempt / "abandoned-captures" / "t" / "s2.jsonl"
    assert json.loads((attempt / "ABANDONED.json").read_text())["captures"] == [str(moved)]
    assert not (captures / "t" / "s2.jsonl").exists() and list(read_capture(moved)) == records[1:]
    assert list(read_capture(captures / "t" / "s1.jsonl")) == records[:1]


def test_an_abandoned_multi_step_attempt_moves_every_steps_capture(tmp_path: Path, monkeypatch):
    """A multi-step task's sample has one session per step (polar/run/multistep.py): each capture moves."""
    monkeypatch.setattr(polar.run.sample, "cleanup_sample", lambda attempt: None)
    captures = tmp_path / "captures"
    writer = CaptureWriter(captures, shared=True, fsync=False)
    records = [first_call("a.s1"), first_call("a.s2"), first_call("other")]
    for r in records:
        writer.write(r)
    attempt = tmp_path / "attempt-1"
    attempt.mkdir()
    steps = [{"name": n, "session": {"task_id": "t", "session_id": f"a.s{i + 1}", "token": "x"}}
             for i, n in enumerate(["one", "two", "three"])]  # the third never ran: no capture
    (attempt / "sample.json").write_text(json.dumps({"session": None, "steps": steps,
                                                     "proxy": {"capture_dir": str(captures)}}))
    abandon(attempt, ProxyProcess("127.0.0.1", 1, 2, tmp_path / "ca.pem", captures, "open"), "node lost", "node_lost")
    moved = [attempt / "abandoned-captures" / "t" / f"a.s{n}.jsonl" for n in (1, 2)]
    assert json.loads((attempt / "ABANDONED.json").read_text())["captures"] == [str(m) for m in moved]
    assert [list(read_capture(m)) for m in moved] == [records[:1], records[1:2]]
    assert list(read_capture(captures / "t" / "other.jsonl")) == records[2:]
