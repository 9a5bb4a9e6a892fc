"""What a run produced: the calls it recorded, its trajectories (prefix_merge) and the files it changed."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SKIP_DIRS = {".git", "node_modules", "__pycache__"}


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


def snapshot(root: Path) -> dict[str, str]:
    """relative path -> sha256 of every regular file under root (symlinks by target text)."""
    out: dict[str, str] = {}
    if not root.is_dir():
        return out
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if SKIP_DIRS & set(rel.parts):
            continue
        if path.is_symlink():
            out[str(rel)] = "link:" + str(path.readlink())
        elif path.is_file():
            out[str(rel)] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


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


def build_trajectories(files: list[Path], parquet: Path, entries: list[dict[str, Any]],
                       whole_dir: bool = False) -> tuple[Any, str | None]:
    """prefix_merge trajectories of the capture files' sessions (or, with whole_dir, of every session in their
    folder's capture root), with these outcome entries, into `parquet`: (BuildResult, None), or (None, why)."""
    from polar_traj.build import BuildConfig
    from polar_traj.outcomes import parse_outcomes
    from polar_traj.pipeline import Selection, build_parquet

    root = files[0].parents[1]  # <captures>/<task_id>/<session>.jsonl
    selection = Selection(root) if whole_dir else Selection(root, files[0].parent.name, files[0].stem)
    try:
        return build_parquet(selection, parquet, BuildConfig(strategy="prefix_merge"), parse_outcomes(entries)), None
    except (OSError, ValueError) as e:
        return None, f"trajectories not built: {e}"
