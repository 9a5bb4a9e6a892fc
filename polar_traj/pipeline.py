"""Capture directory -> trajectories -> one Parquet part, one session at a time."""
from __future__ import annotations

import gc
import json
import os
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Iterator

from .build import BuildConfig, Trajectory, build_session
from .outcomes import AdvantageConfig, OutcomePlan, Outcomes, no_outcomes
from .parquet import TrajectoryWriter, part_path
from .reading import SessionFile, read_session, scan
from .schema import STATS_KEY
from .stats import MergeStats

Progress = Callable[[list[SessionFile]], Iterable[SessionFile]]


@dataclass(frozen=True)
class Selection:
    """Which capture files to read, and how strictly."""

    capture_dir: str | os.PathLike
    task_id: str | None = None
    session_id: str | None = None
    strict: bool = True  # False: skip invalid lines (counted in stats.invalid_records)


@dataclass
class BuildResult:
    path: Path | None
    rows: int
    stats: MergeStats
    unmatched_outcomes: list[str] = field(default_factory=list)  # outcome sessions with no capture file


def iter_trajectories(selection: Selection, config: BuildConfig = BuildConfig(),
                      outcomes: Outcomes | None = None, advantage: AdvantageConfig = AdvantageConfig(),
                      stats: MergeStats | None = None,
                      progress: Progress | None = None) -> Iterator[Trajectory]:
    """Trajectories with outcomes applied, session by session; adds each session's stats to `stats`."""
    files = scan(selection.capture_dir, selection.task_id, selection.session_id)
    plan = OutcomePlan(outcomes or no_outcomes(), files, advantage)
    # per_request keeps every call's payload; prefix_merge re-reads only the last call of each chain
    payloads = config.keep_conversation and config.strategy == "per_request"
    for sf in (progress(files) if progress else files):
        session = read_session(sf, payloads=payloads, strict=selection.strict)
        trajectories, session_stats = build_session(session, config)
        if stats is not None:
            stats.add(session_stats)
        yield from plan.apply(trajectories)


@contextmanager
def gc_paused() -> Iterator[None]:
    """The cyclic garbage collector off for a build. Each collection walks every young container, and a
    record's id tuples (and a per_request row's lists) hold tens of thousands of ints each: a fifth of a
    build's CPU went there. A build makes next to no reference cycles (its sessions are freed by reference
    counting as it moves on); the collector runs again, as it was, when the build ends."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def build_parquet(selection: Selection, out: str | os.PathLike, config: BuildConfig = BuildConfig(),
                  outcomes: Outcomes | None = None, advantage: AdvantageConfig = AdvantageConfig(),
                  progress: Progress | None = None) -> BuildResult:
    """Write one Parquet file (or, when `out` is a directory, a new part inside it)."""
    as_dir = os.fspath(out).endswith(("/", os.sep)) or Path(out).is_dir()
    target = part_path(out) if as_dir else Path(out)
    stats = MergeStats(strategy=config.strategy)
    with gc_paused(), TrajectoryWriter(target) as writer:
        for t in iter_trajectories(selection, config, outcomes, advantage, stats, progress):
            writer.write(t.row())
        writer.set_metadata(STATS_KEY, json.dumps(stats.to_dict()))
    seen = {sf.session_id for sf in scan(selection.capture_dir, selection.task_id, selection.session_id)}
    unmatched = sorted(set((outcomes or no_outcomes()).sessions) - seen)
    return BuildResult(target, writer.rows_written, stats, unmatched)
