"""Find capture files and read one session at a time: memory stays flat in the number of files.

Layout (DESIGN.md §3): `<capture_dir>/<task_id>/<session_id>.jsonl`. A session is read with its
provider payloads (`request`, `response`) dropped; `Session.payload(call_id)` re-reads the one line
that is needed, so a long session never holds every request (each repeats the whole history).
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Iterator

from .records import CallRecord

SUFFIX = ".jsonl"
MAX_TOKEN_ID = 2**31 - 1


@dataclass(frozen=True)
class SessionFile:
    task_id: str
    session_id: str
    path: Path


@dataclass
class Session:
    file: SessionFile
    records: list[CallRecord]  # file order; payloads empty unless read with payloads=True
    problems: list[str] = field(default_factory=list)  # invalid lines skipped (non-strict reads)
    offsets: dict[str, int] = field(default_factory=dict)  # call_id -> byte offset of its line

    @property
    def task_id(self) -> str:
        return self.file.task_id

    @property
    def session_id(self) -> str:
        return self.file.session_id

    def payload(self, call_id: str) -> tuple[dict[str, Any], dict[str, Any] | None]:
        """(request, response) of one call, read back from its line."""
        with open(self.file.path, "rb") as f:
            f.seek(self.offsets[call_id])
            data = json.loads(f.readline())
        return data.get("request") or {}, data.get("response")


def scan(capture_dir: str | os.PathLike, task_id: str | None = None,
         session_id: str | None = None) -> list[SessionFile]:
    """Capture files under a capture root, a single task directory, or one .jsonl file; sorted."""
    root = Path(capture_dir)
    if root.is_file():
        found = [SessionFile(root.parent.name, root.name[: -len(SUFFIX)], root)]
    elif not root.is_dir():
        raise FileNotFoundError(f"no capture directory or file at {root}")
    elif any(p.suffix == SUFFIX for p in root.iterdir() if p.is_file()):
        found = list(_task_files(root, root.name))
    else:
        found = [sf for d in sorted(root.iterdir()) if d.is_dir() for sf in _task_files(d, d.name)]
    return [sf for sf in found
            if (task_id is None or sf.task_id == task_id) and (session_id is None or sf.session_id == session_id)]


def _task_files(task_dir: Path, task_id: str) -> Iterator[SessionFile]:
    for path in sorted(task_dir.iterdir()):
        if path.is_file() and path.suffix == SUFFIX and not path.name.startswith("."):
            yield SessionFile(task_id, path.name[: -len(SUFFIX)], path)


def read_session(sf: SessionFile, payloads: bool = False, strict: bool = True) -> Session:
    """All records of one capture file, validated. strict: raise on the first bad line; otherwise skip it
    and note why in `problems`. A torn last line (the writer died mid-line) is always skipped."""
    session = Session(sf, [])
    seen: set[str] = set()
    for offset, lineno, data in _lines(sf.path):
        try:
            if not payloads:
                data["request"], data["response"] = {}, None
            record = record_from_dict(data)
            problems = validate(record, sf, seen)
            if problems:
                raise ValueError("; ".join(problems))
        except (ValueError, TypeError, KeyError) as e:
            message = f"{sf.path}:{lineno}: {e}"
            if strict:
                raise ValueError(message) from e
            session.problems.append(message)
            continue
        seen.add(record.call_id)
        session.offsets[record.call_id] = offset
        session.records.append(record)
    return session


def iter_sessions(files: list[SessionFile], payloads: bool = False, strict: bool = True) -> Iterator[Session]:
    for sf in files:
        yield read_session(sf, payloads=payloads, strict=strict)


def _lines(path: Path) -> Iterator[tuple[int, int, dict[str, Any]]]:
    """(byte offset, line number, parsed object) for each non-blank line."""
    offset = 0
    with open(path, "rb") as f:
        for lineno, line in enumerate(f, 1):
            start, offset = offset, offset + len(line)
            if not line.strip():
                continue
            try:
                data = json.loads(line)
            except json.JSONDecodeError as e:
                if not line.endswith(b"\n"):
                    return  # torn last line: only the last line can lack its newline
                raise ValueError(f"{path}:{lineno}: not a JSON record ({e})") from e
            if not isinstance(data, dict):
                raise ValueError(f"{path}:{lineno}: a record must be a JSON object")
            yield start, lineno, data


_FIELDS = frozenset(f.name for f in fields(CallRecord))
_OPTIONAL = frozenset({"error", "flags"})


def record_from_dict(data: dict[str, Any]) -> CallRecord:
    """CallRecord.from_dict with a fast path for the usual case (token lists of plain ints, logprobs of
    floats), which skips converting millions of ids one by one; anything else takes from_dict's path."""
    prompt, output, logprobs = data.get("prompt_ids"), data.get("output_ids"), data.get("output_logprobs")
    if (_FIELDS - _OPTIONAL <= data.keys() and type(prompt) is list and type(output) is list
            and _only(prompt, int) and _only(output, int) and (logprobs is None or type(logprobs) is list)
            and _only(logprobs or [], float)):
        kwargs = {k: v for k, v in data.items() if k in _FIELDS}
        kwargs.update(prompt_ids=tuple(prompt), output_ids=tuple(output), output_logprobs=tuple(logprobs or ()),
                      flags=tuple(data.get("flags") or ()))
        return CallRecord(**kwargs)
    return CallRecord.from_dict(data)


def _only(values: list[Any], kind: type) -> bool:
    return not values or set(map(type, values)) == {kind}


def validate(record: CallRecord, sf: SessionFile, seen: set[str]) -> list[str]:
    """What is wrong with one record in its file; empty when it is usable."""
    problems = []
    if record.task_id != sf.task_id or record.session_id != sf.session_id:
        problems.append(f"call {record.call_id} says {record.task_id}/{record.session_id}, "
                        f"its file is {sf.task_id}/{sf.session_id}")
    if record.call_id in seen:
        problems.append(f"duplicate call_id {record.call_id}")
    if min(record.prompt_ids, default=0) < 0 or min(record.output_ids, default=0) < 0:
        problems.append(f"call {record.call_id}: negative token id")
    if max(record.prompt_ids, default=0) > MAX_TOKEN_ID or max(record.output_ids, default=0) > MAX_TOKEN_ID:
        problems.append(f"call {record.call_id}: token id above {MAX_TOKEN_ID} (the table stores int32)")
    if not all(map(math.isfinite, record.output_logprobs)):
        problems.append(f"call {record.call_id}: non-finite logprob")
    if record.error is None and not record.prompt_ids:
        problems.append(f"call {record.call_id}: no prompt_ids on a call without error")
    return problems
