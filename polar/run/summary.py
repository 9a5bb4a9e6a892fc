"""What a run produced: the calls it recorded, its trajectories (prefix_merge) and the files it changed."""
from __future__ import annotations

import hashlib
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SKIP_DIRS = {".git", "node_modules", "__pycache__"}
# The workspace is the agent's: whatever it left (a 64 GiB sparse file, a FIFO, a million files), a snapshot costs
# the worker bounded memory and time.
CHUNK = 1 << 20  # bytes read at a time when hashing
HASH_LIMIT = 64 << 20  # a larger file is recorded by its stat line, not read
TOTAL_HASH_LIMIT = 1 << 30  # bytes hashed per snapshot (~2 s here); later files by their stat line
MAX_ENTRIES = 100_000  # files, links and folders walked; past that the snapshot fails with WorkspaceTooLarge


class WorkspaceTooLarge(ValueError):
    """More entries than a snapshot walks: the agent made them (or the task's workspace is too big)."""


@dataclass
class RunSummary:
    sessions: list[str] = field(default_factory=list)
    calls: int = 0
    error_calls: int = 0
    prompt_tokens: int = 0  # summed over calls (what per_request would train on, prompt side)
    output_tokens: int = 0  # sampled tokens
    trajectories: int = 0
    calls_merged: int = 0
    starts: dict[str, int] = field(default_factory=dict)
    breaks: dict[str, int] = field(default_factory=dict)
    files_changed: dict[str, list[str]] = field(default_factory=dict)

    def lines(self) -> list[str]:
        starts = ", ".join(f"{k} {v}" for k, v in self.starts.items() if v) or "none"
        breaks = ", ".join(f"{k} {v}" for k, v in self.breaks.items() if v) or "none"
        changed = ", ".join(f"{kind} {len(paths)}" for kind, paths in self.files_changed.items() if paths) or "none"
        return [
            f"calls: {self.calls} ({self.error_calls} with an error) in {len(self.sessions)} session file(s)",
            f"tokens: prompt {self.prompt_tokens}, sampled {self.output_tokens}",
            f"prefix_merge: {self.trajectories} trajectories, {self.calls_merged} calls merged; "
            f"chain starts {starts}; breaks {breaks}",
            f"files changed: {changed}",
        ]


def snapshot(root: Path, max_entries: int = MAX_ENTRIES) -> dict[str, str]:
    """relative path -> what is there, for every entry under root but folders: a regular file's sha256 (its
    stat line above the caps), a symlink's target text, a special file's kind. Nothing is followed and no special
    file is opened (opening a FIFO blocks); WorkspaceTooLarge past `max_entries` entries."""
    out: dict[str, str] = {}
    if root.is_symlink() or not root.is_dir():
        return out
    budget, walked, folders = TOTAL_HASH_LIMIT, 0, [""]
    while folders:
        rel_dir = folders.pop()
        entries = []
        try:
            with os.scandir(root / rel_dir) as it:
                for entry in it:  # counted as read: one folder may hold millions
                    walked += 1
                    if walked > max_entries:
                        raise WorkspaceTooLarge(f"the workspace holds more than {max_entries} entries")
                    entries.append(entry)
        except OSError:
            continue  # unreadable: what it holds is not in the snapshot (nor in the verify copy)
        for entry in sorted(entries, key=lambda e: e.name):
            if entry.name in SKIP_DIRS:
                continue
            rel = f"{rel_dir}/{entry.name}" if rel_dir else entry.name
            try:
                st = entry.stat(follow_symlinks=False)
                if stat.S_ISDIR(st.st_mode):
                    folders.append(rel)
                elif stat.S_ISLNK(st.st_mode):
                    out[rel] = "link:" + os.readlink(entry.path)
                elif stat.S_ISREG(st.st_mode):
                    out[rel], hashed = _digest(entry.path, st, budget)
                    budget -= hashed
                else:
                    out[rel] = "special:" + _kind(st.st_mode)
            except OSError:
                continue  # gone since the listing, or a path too long to name
    return dict(sorted(out.items()))


def _digest(path: str, st: os.stat_result, budget: int) -> tuple[str, int]:
    """(sha256, bytes read) of a regular file, read in chunks; (stat line, 0) above the caps or unreadable."""
    if st.st_size > HASH_LIMIT or st.st_size > budget:
        return _stat_line(st), 0
    try:  # O_NOFOLLOW, O_NONBLOCK: a link or FIFO swapped in since the stat is neither followed nor waited on
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return _stat_line(st), 0
    with open(fd, "rb", buffering=0) as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > min(HASH_LIMIT, budget):
            return _stat_line(st), 0
        digest, left = hashlib.sha256(), st.st_size
        while left > 0 and (chunk := f.read(min(CHUNK, left))):
            digest.update(chunk)
            left -= len(chunk)
    return digest.hexdigest(), st.st_size


def _stat_line(st: os.stat_result) -> str:
    """A file not read: ctime is in, since the agent can set mtime back but not ctime."""
    return f"stat:size={st.st_size}:mtime_ns={st.st_mtime_ns}:ctime_ns={st.st_ctime_ns}"


def _kind(mode: int) -> str:
    for kind, test in (("fifo", stat.S_ISFIFO), ("socket", stat.S_ISSOCK), ("char-device", stat.S_ISCHR),
                       ("block-device", stat.S_ISBLK)):
        if test(mode):
            return kind
    return "other"


def changed_files(before: dict[str, str], after: dict[str, str]) -> dict[str, list[str]]:
    return {
        "added": sorted(set(after) - set(before)),
        "modified": sorted(p for p in set(after) & set(before) if after[p] != before[p]),
        "removed": sorted(set(before) - set(after)),
    }


def count_calls(files: list[Path], summary: RunSummary | None = None) -> int:
    """The calls recorded in these capture files (each file one session), tallied into `summary` if given."""
    from polar_traj.capture_reader import read_capture

    summary = summary or RunSummary()
    for f in files:
        summary.sessions.append(f.stem)
        for r in read_capture(f):
            summary.calls += 1
            summary.error_calls += r.error is not None
            summary.prompt_tokens += len(r.prompt_ids)
            summary.output_tokens += len(r.output_ids)
    return summary.calls


def outcome_entries(files: list[Path], harness: str, status: str, reason: str | None) -> list[dict[str, Any]]:
    entry: dict[str, Any] = {"status": status, "harness": harness}
    if reason:
        entry["reason"] = reason
    return [dict(entry, session_id=f.stem) for f in files]


def summarize(files: list[Path], parquet: Path, harness: str, status: str, reason: str | None,
              changed: dict[str, list[str]]) -> tuple[RunSummary, str | None]:
    """Count the calls and build `parquet` (prefix_merge) from the run's capture files.
    Returns the summary and an error text when the trajectories could not be built."""
    summary = RunSummary(files_changed=changed)
    if not files:
        return summary, None
    try:
        count_calls(files, summary)
    except (OSError, ValueError) as e:
        return summary, f"trajectories not built: {e}"
    built, error = build_trajectories(files, parquet, outcome_entries(files, harness, status, reason), whole_dir=True)
    if built is None:
        return summary, error
    stats = built.stats
    summary.trajectories, summary.calls_merged = stats.trajectories, stats.calls_merged
    summary.starts, summary.breaks = dict(stats.starts), dict(stats.breaks)
    return summary, None


CONTENT_FAILURE = "trajectories not built from the session's content"


def build_trajectories(files: list[Path], parquet: Path, entries: list[dict[str, Any]],
                       whole_dir: bool = False, strategy: str = "prefix_merge") -> tuple[Any, str | None]:
    """Trajectories (prefix_merge, or per_request) of the capture files' sessions (or, with whole_dir, of every session in their
    folder's capture root), with these outcome entries, into `parquet`: (BuildResult, None), or (None, why)."""
    from polar_traj.build import BuildConfig
    from polar_traj.outcomes import parse_outcomes
    from polar_traj.pipeline import Selection, build_parquet

    root = files[0].parents[1]  # <captures>/<task_id>/<session>.jsonl
    selection = Selection(root) if whole_dir else Selection(root, files[0].parent.name, files[0].stem)
    try:
        return build_parquet(selection, parquet, BuildConfig(strategy=strategy), parse_outcomes(entries)), None
    except OSError as e:
        return None, f"trajectories not built: {e}"
    except ValueError as e:  # UnicodeError included: what the session's own calls and files hold
        return None, f"{CONTENT_FAILURE}: {e}"
