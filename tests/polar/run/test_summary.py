"""Workspace snapshots and the file-change report of a run; a snapshot costs bounded memory and time whatever the
agent left (issue 24): a 64 GiB sparse file, a FIFO, too many files."""
from __future__ import annotations

import hashlib
import os
import resource
import socket
import time

import pytest

from polar.run.summary import (HASH_LIMIT, RunSummary, WorkspaceTooLarge, changed_files, outcome_entries,
                               snapshot)


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


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def test_a_64_gib_sparse_file_and_a_fifo_cost_no_memory(tmp_path):
    with open(tmp_path / "big.bin", "wb") as f:
        f.truncate(64 * 2**30)  # no disk: a hole
    os.mkfifo(tmp_path / "pipe")  # opening it would block: it must not be opened
    (tmp_path / "small.txt").write_text("hi")
    rss, start = peak_rss_mb(), time.monotonic()
    snap = snapshot(tmp_path)
    assert time.monotonic() - start < 5
    assert peak_rss_mb() - rss < 200
    st = os.stat(tmp_path / "big.bin")
    assert snap["big.bin"] == f"stat:size={64 * 2**30}:mtime_ns={st.st_mtime_ns}:ctime_ns={st.st_ctime_ns}"
    assert snap["pipe"] == "special:fifo"
    assert snap["small.txt"] == hashlib.sha256(b"hi").hexdigest()


def test_a_file_at_the_cap_is_hashed_in_chunks_and_one_above_by_stat(tmp_path):
    with open(tmp_path / "at.bin", "wb") as f:
        f.truncate(HASH_LIMIT)
    with open(tmp_path / "above.bin", "wb") as f:
        f.truncate(HASH_LIMIT + 1)
    snap = snapshot(tmp_path)
    assert snap["at.bin"] == hashlib.sha256(bytes(HASH_LIMIT)).hexdigest()
    assert snap["above.bin"].startswith(f"stat:size={HASH_LIMIT + 1}:")


def test_a_big_file_rewritten_with_its_old_mtime_still_counts_as_changed(tmp_path):
    """A stat line carries ctime, which the agent cannot set back (it can set mtime)."""
    big = tmp_path / "data.bin"
    with open(big, "wb") as f:
        f.truncate(HASH_LIMIT + 1)
    before, st = snapshot(tmp_path), os.stat(big)
    time.sleep(0.01)
    with open(big, "r+b") as f:
        f.write(b"changed")
    os.utime(big, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert changed_files(before, snapshot(tmp_path))["modified"] == ["data.bin"]


def test_special_files_are_marked_and_links_never_followed(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "f").write_text("x")
    (tmp_path / "to-dir").symlink_to("real")
    (tmp_path / "to-fifo").symlink_to("pipe")
    os.mkfifo(tmp_path / "pipe")
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(tmp_path / "sock"))
        snap = snapshot(tmp_path)
    assert snap == {"pipe": "special:fifo", "real/f": hashlib.sha256(b"x").hexdigest(), "sock": "special:socket",
                    "to-dir": "link:real", "to-fifo": "link:pipe"}


def test_too_many_entries_is_an_error_not_a_long_walk(tmp_path):
    for i in range(30):
        (tmp_path / f"f{i}").write_text("")
    assert len(snapshot(tmp_path, max_entries=30)) == 30
    with pytest.raises(WorkspaceTooLarge, match="more than 29 entries"):
        snapshot(tmp_path, max_entries=29)


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
