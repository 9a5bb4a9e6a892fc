"""The proxy's status file: a small JSON object (pid, RSS, what it holds for its sessions) rewritten every few
seconds, so whoever started the proxy (a worker node: `polar status`) can show its memory and notice that it stopped
reporting. Replaced whole (polar_traj/atomic.py): a reader never sees half of one."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from polar_traj import atomic

INTERVAL_S = 5.0
STALE_S = 3 * INTERVAL_S  # not rewritten for this long: the proxy is gone or stuck


def rss_bytes() -> int:
    """This process's resident set size."""
    with open("/proc/self/statm", "rb") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def write_status(path: Path, figures: dict[str, Any]) -> None:
    atomic.write_text(path, json.dumps({"pid": os.getpid(), "at": time.time(), "rss_bytes": rss_bytes(), **figures}))


def read_status(path: Path) -> dict[str, Any]:
    """The last status written, with `state`: reporting, stale (not rewritten for STALE_S: gone or stuck) or
    missing (no status yet, or the proxy stopped and removed it)."""
    try:
        status = json.loads(path.read_text())
    except (OSError, ValueError):
        return {"state": "missing"}
    age = time.time() - float(status.get("at", 0))
    return {**status, "state": "stale" if age > STALE_S else "reporting", "age_s": round(age, 1)}
