"""polar.run.session.capture_files: a run's copy of its session's capture file reads back whole where it lands."""
from __future__ import annotations

from pathlib import Path

from polar.run.services import SessionLogin
from polar.run.session import capture_files
from polar_mitm.launch import ProxyProcess
from polar_traj.capture_reader import read_capture
from polar_traj.captures import CaptureWriter
from polar_traj.records import CallRecord


def first_call(session_id: str) -> CallRecord:
    """A first call whose 2,000-id system prompt every session of the harness shares."""
    return CallRecord(f"{session_id}-c0", "t", session_id, "openai_chat", "m", False, 0.0, 1.0, 1.0, None,
                      tuple(range(1, 2001)) + (7,), (1, 2), (-0.5, -0.25), "stop", "rendered:first_call", None,
                      {"messages": [{"role": "system", "content": "rules " * 100}]}, None)


def test_a_copied_capture_brings_the_shared_prefix_it_refers_to(tmp_path: Path):
    writer = CaptureWriter(tmp_path / "proxy", shared=True, fsync=False)
    records = [first_call("s1"), first_call("s2")]
    for r in records:
        writer.write(r)
    assert (tmp_path / "proxy" / "_shared").is_dir()  # s2's line refers to it
    proxy = ProxyProcess("127.0.0.1", 1, 2, tmp_path / "ca.pem", tmp_path / "proxy", "open")
    (copied,) = capture_files(proxy, False, SessionLogin("t", "s2", "tok"), tmp_path / "run")
    assert copied == tmp_path / "run" / "captures" / "t" / "s2.jsonl"
    assert list(read_capture(copied)) == records[1:]
    assert capture_files(proxy, False, SessionLogin("t", "gone", "tok"), tmp_path / "run") == []
