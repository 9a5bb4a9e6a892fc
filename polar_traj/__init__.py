"""polar_traj: trajectories from captured calls, written as Parquet.

Light on import (the proxy imports `polar_traj.records`); pyarrow loads when a table is touched.
    polar_traj.read(path) -> pyarrow.Table                       a file or a directory of parts
    polar_traj.pipeline.build_parquet(Selection(capture_dir, task_id=…), out, BuildConfig(…),
                                      outcomes, AdvantageConfig(…)) -> BuildResult
    polar_traj.analysis.{rewards_by_harness, turns_and_tokens, merge_stats, summary}
    polar_traj.export.write_export(table, "slime" | "verl" | "sft", out)
See docs/trajectories.md.
"""
from __future__ import annotations

from typing import Any


def read(path: Any, columns: list[str] | None = None) -> Any:
    """The trajectory table of one Parquet file or a directory of parts, as a pyarrow Table."""
    from .parquet import read as _read

    return _read(path, columns=columns)
