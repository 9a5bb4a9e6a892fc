"""Workspace snapshots and the file-change report of a run."""
from __future__ import annotations

from polar.run.summary import RunSummary, changed_files, outcome_entries, snapshot


def test_snapshot_and_changes(tmp_path):
    (tmp_path / "keep.txt").write_text("same")
    (tmp_path / "edit.txt").write_text("old")
    (tmp_path / "gone.txt").write_text("bye")
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "HEAD").write_text("ref")
    before = snapshot(tmp_path)
    assert set(before) == {"keep.txt", "edit.txt", "gone.txt"}
    (tmp_path / "edit.txt").write_text("new")
    (tmp_path / "gone.txt").unlink()
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "new.txt").write_text("hi")
    (tmp_path / "link").symlink_to("keep.txt")
    assert changed_files(before, snapshot(tmp_path)) == {
        "added": ["link", "sub/new.txt"], "modified": ["edit.txt"], "removed": ["gone.txt"]}


def test_snapshot_of_missing_dir(tmp_path):
    assert snapshot(tmp_path / "nope") == {}


def test_outcome_entries(tmp_path):
    files = [tmp_path / "local" / "s1.jsonl"]
    assert outcome_entries(files, "pi", "error", "harness exited 3") == [
        {"session_id": "s1", "status": "error", "harness": "pi", "reason": "harness exited 3"}]
    assert outcome_entries(files, "pi", "completed", None) == [
        {"session_id": "s1", "status": "completed", "harness": "pi"}]


def test_summary_lines():
    s = RunSummary(sessions=["s1"], calls=3, error_calls=1, prompt_tokens=100, output_tokens=20, trajectories=2,
                   calls_merged=1, starts={"new": 2, "fork": 0}, breaks={"template": 0},
                   files_changed={"added": ["a"], "modified": [], "removed": []})
    text = "\n".join(s.lines())
    assert "calls: 3 (1 with an error) in 1 session file(s)" in text
    assert "2 trajectories, 1 calls merged; chain starts new 2; breaks none" in text
    assert "files changed: added 1" in text
