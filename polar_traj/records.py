"""The CallRecord contract (DESIGN.md §3): one JSON object per line, shared by the proxy and polar_traj."""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Iterator

APIS = ("openai_chat", "openai_responses", "anthropic", "gemini")


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
    prompt_ids: tuple[int, ...]  # exactly what the engine consumed
    output_ids: tuple[int, ...]  # exactly what it sampled
    output_logprobs: tuple[float, ...]  # same length as output_ids
    finish_reason: str | None
    prefix_source: str  # "substituted" | "rendered:<why>"
    parent_call_id: str | None
    request: dict[str, Any]
    response: dict[str, Any] | None
    error: str | None = None
    flags: tuple[str, ...] = field(default=())  # e.g. "unparsed_tool_call"

    def __post_init__(self) -> None:
        if self.api not in APIS:
            raise ValueError(f"call {self.call_id}: unknown api {self.api!r}, expected one of {APIS}")
        if self.output_logprobs and len(self.output_logprobs) != len(self.output_ids):
            raise ValueError(
                f"call {self.call_id}: {len(self.output_ids)} output_ids but {len(self.output_logprobs)} logprobs"
            )

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"), ensure_ascii=False)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "CallRecord":
        names = {f.name for f in fields(cls)}
        missing = names - set(data) - {"error", "flags"}
        if missing:
            raise ValueError(f"record {data.get('call_id', '?')}: missing fields {sorted(missing)}")
        kwargs = {k: v for k, v in data.items() if k in names}
        for key in ("prompt_ids", "output_ids"):
            kwargs[key] = tuple(int(t) for t in kwargs[key])
        kwargs["output_logprobs"] = tuple(float(x) for x in kwargs["output_logprobs"] or ())
        kwargs["flags"] = tuple(kwargs.get("flags") or ())
        return cls(**kwargs)


def record_path(capture_dir: str | os.PathLike, task_id: str, session_id: str) -> Path:
    return Path(capture_dir) / task_id / f"{session_id}.jsonl"


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


def iter_records(path: str | os.PathLike) -> Iterator[CallRecord]:
    """Records of one capture file; a torn last line (writer killed mid-write) is skipped, others must parse."""
    with open(path, encoding="utf-8") as f:
        lines = f.readlines()
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
        except json.JSONDecodeError as e:
            if n == len(lines) and not line.endswith("\n"):
                return
            raise ValueError(f"{path}:{n}: not a JSON record ({e})") from e
        yield CallRecord.from_dict(data)
