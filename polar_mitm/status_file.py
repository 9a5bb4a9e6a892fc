"""The proxy's status file: a small JSON object (pid, RSS, what it holds for its sessions) rewritten every few
seconds, so whoever started the proxy (a worker node: `polar status`) can show its memory and notice that it stopped
reporting. Replaced whole (polar_traj/atomic.py): a reader never sees half of one. The proxy's writer (StatusFile,
option `polar_status_file`) and the node's reader (`read_status`) both live here."""
from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from pathlib import Path
from typing import Any, Callable

from polar_traj import atomic

log = logging.getLogger(__name__)
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


class StatusFile:
    """The proxy's writer: `figures()` (what it holds for its sessions) every INTERVAL_S while it runs; the file is
    removed at a clean stop (stopped, not stale)."""

    def __init__(self, figures: Callable[[], dict[str, Any]]) -> None:
        self.figures = figures
        self.path: Path | None = None
        self._task: asyncio.Task[None] | None = None
        self._written: Path | None = None  # the file this run writes

    def load(self, loader) -> None:
        loader.add_option("polar_status_file", str, "",
                          "JSON file rewritten every few seconds with this proxy's pid, RSS and session memory "
                          "(`polar status` shows it for a node's proxies); removed at a clean stop. Empty = none.")

    def configure(self, updated) -> None:
        from mitmproxy import ctx  # the proxy's side only: a node reads the file without mitmproxy

        if "polar_status_file" in updated:
            self.path = Path(ctx.options.polar_status_file) if ctx.options.polar_status_file else None

    def running(self) -> None:
        if self.path is not None:
            self._written = self.path
            # held: the loop keeps tasks only weakly
            self._task = asyncio.get_running_loop().create_task(self._write_forever(self.path))

    def done(self) -> None:
        if self._task is not None:
            self._task.cancel()
        if self._written is not None:
            self._written.unlink(missing_ok=True)  # stopped, not stale

    async def _write_forever(self, path: Path) -> None:
        while True:
            try:
                write_status(path, self.figures())
            except OSError as e:  # a full disk must not stop the proxy; the reader sees the file go stale
                log.warning("polar: status file %s: %s", path, e)
            await asyncio.sleep(INTERVAL_S)
