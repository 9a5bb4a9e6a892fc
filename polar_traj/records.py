"""The CallRecord contract (docs/design.md §3): one JSON object per line, shared by the proxy and polar_traj."""
from __future__ import annotations

import json
import os
import re
from array import array
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Sequence

APIS = ("openai_chat", "openai_responses", "anthropic", "gemini")
# task and session ids become folder and file names: one safe shape, checked wherever an id enters.
ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def check_id(value: str, field: str = "id") -> str:
    """`value` if it is a safe task/session id (letters, digits, `._-`, no leading dot, at most 128), else ValueError."""
    if not isinstance(value, str) or not ID_PATTERN.fullmatch(value):
        raise ValueError(f"{field} {value!r} is not a valid id: use 1-128 of A-Z a-z 0-9 . _ - "
                         "(not starting with . _ or -)")
    return value


def plain_ids(value: Any) -> list[int]:
    """json.dumps' `default`: an id array as the list it holds."""
    if isinstance(value, array):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


OPTIONAL_FIELDS = frozenset({"error", "flags", "engine"})  # older records may lack them


@dataclass(frozen=True)
class CallRecord:
    call_id: str
    task_id: str
    session_id: str
    api: str
    model: str
    stream: bool
    started_at: float  # unix seconds
    ended_at: float
    latency_ms: float
    policy_version: int | None
    # exactly what the engine consumed: a tuple, or the proxy's array('i') (a substituted prompt is concatenated
    # from the session's arrays and written from its buffer: no Python int per id)
    prompt_ids: Sequence[int]
    output_ids: tuple[int, ...]  # exactly what it sampled
    output_logprobs: tuple[float, ...]  # same length as output_ids
    finish_reason: str | None
    prefix_source: str  # "substituted" | "rendered:<why>"
    parent_call_id: str | None
    request: dict[str, Any]
    response: dict[str, Any] | None
    error: str | None = None
    flags: tuple[str, ...] = field(default=())  # e.g. "unparsed_tool_call"
    engine: str | None = None  # URL of the engine replica that served the call (null: not sent to one)

    def __post_init__(self) -> None:
        if self.api not in APIS:
            raise ValueError(f"call {self.call_id}: unknown api {self.api!r}, expected one of {APIS}")
        if self.output_logprobs and len(self.output_logprobs) != len(self.output_ids):
            raise ValueError(
                f"call {self.call_id}: {len(self.output_ids)} output_ids but {len(self.output_logprobs)} logprobs"
            )

    def to_json(self) -> str:
        """One JSON line. Text that is not valid Unicode (a lone surrogate from a broken tool output, sent as
        a JSON escape) is kept as a `\\udXXX` escape: the line stays valid UTF-8 and `json.loads` returns
        the same strings."""
        data = {f.name: getattr(self, f.name) for f in fields(self)}  # no deep copy: the fields are plain values
        line = json.dumps(data, separators=(",", ":"), ensure_ascii=False, default=plain_ids)
        try:
            line.encode("utf-8")
        except UnicodeEncodeError:
            line = json.dumps(data, separators=(",", ":"), ensure_ascii=True, default=plain_ids)
        return line

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "CallRecord":
        names = {f.name for f in fields(cls)}
        missing = names - set(data) - OPTIONAL_FIELDS
        if missing:
            raise ValueError(f"record {data.get('call_id', '?')}: missing fields {sorted(missing)}")
        kwargs = {k: v for k, v in data.items() if k in names}
        for key in ("prompt_ids", "output_ids"):
            kwargs[key] = tuple(int(t) for t in kwargs[key])
        kwargs["output_logprobs"] = tuple(float(x) for x in kwargs["output_logprobs"] or ())
        kwargs["flags"] = tuple(kwargs.get("flags") or ())
        return cls(**kwargs)


def record_path(capture_dir: str | os.PathLike, task_id: str, session_id: str) -> Path:
    """`<capture_dir>/<task_id>/<session_id>.jsonl`; refuses ids that could name a path outside capture_dir."""
    root = Path(capture_dir)
    path = root / check_id(task_id, "task_id") / f"{check_id(session_id, 'session_id')}.jsonl"
    if not path.resolve().is_relative_to(root.resolve()):
        raise ValueError(f"{path} is outside the capture folder {root}")
    return path


def append_record(capture_dir: str | os.PathLike, record: CallRecord) -> Path:
    """Append one line and flush it to disk before returning: a crash after this loses nothing."""
    path = record_path(capture_dir, record.task_id, record.session_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    line = record.to_json() + "\n"
    with open(path, "a", encoding="utf-8") as f:
        f.write(line)
        f.flush()
        os.fsync(f.fileno())
    return path
