"""Capture: appends each finished call's CallRecord to its session's file, flushed before the reply ends."""
from __future__ import annotations

import logging
from pathlib import Path

from mitmproxy import ctx
from mitmproxy.exceptions import OptionsError

from polar_traj.records import CallRecord, append_record

log = logging.getLogger(__name__)


def parse_capture_dir(spec: str) -> Path:
    path = Path(spec).expanduser()
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ValueError(f"cannot create {path}: {e.strerror}") from e
    return path


class CaptureError(Exception):
    """A record could not be written; the harness must not get a reply that was not recorded."""


class Capture:
    def __init__(self) -> None:
        self.capture_dir: Path | None = None

    def load(self, loader) -> None:
        loader.add_option("polar_capture_dir", str, "captures", "Where CallRecords go: DIR/<task_id>/<session_id>.jsonl")

    def configure(self, updated) -> None:
        if "polar_capture_dir" in updated:
            try:
                self.capture_dir = parse_capture_dir(ctx.options.polar_capture_dir)
            except ValueError as e:
                raise OptionsError(f"polar_capture_dir: {e}") from e

    def write(self, record: CallRecord) -> None:
        if self.capture_dir is None:
            raise CaptureError("polar_capture_dir is not configured")
        try:
            append_record(self.capture_dir, record)
        except (OSError, ValueError, UnicodeError) as e:  # disk full, unsafe ids, unencodable text
            log.error("polar: capture of call %s failed: %s", record.call_id, e)
            raise CaptureError(f"recording the call failed: {e}") from e
