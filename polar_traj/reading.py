"""Find capture files and read one session at a time: memory stays flat in the number of files.

Layout (docs/design.md §3): `<capture_dir>/<task_id>/<session_id>.jsonl`, either capture format
(docs/captures.md), read back as a `CapturedSession`: its CallRecords, with the provider payloads (`request`,
`response`) out of the records; `CapturedSession.payload(call_id)` gives the one that is needed: kept in memory
from a linear file (whose requests share their common parts, so they take about the file's size), re-read by byte
offset from a format-1 file (whose requests each repeat the whole history). A format-1 line's response (the reply
alone, parsed anyway) is kept: `CapturedSession.response(call_id)` needs no re-read.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence

from .capture_reader import CaptureDecoder, without_prompt_ids
from .capture_reader import record_from_dict  # noqa: F401 (re-exported)
from .captures import loads_line
from .records import CallRecord

SUFFIX = ".jsonl"
MAX_TOKEN_ID = 2**31 - 1


@dataclass(frozen=True)
class SessionFile:
    task_id: str
    session_id: str
    path: Path


@dataclass
class CapturedSession:
    """One session's capture file read back: its CallRecords in file order (the proxy's session itself is
    polar_mitm/sessions/registry.py's Session)."""

    file: SessionFile
    records: list[CallRecord]  # file order; payloads empty unless read with payloads=True
    problems: list[str] = field(default_factory=list)  # invalid lines skipped (non-strict reads)
    offsets: dict[str, int] = field(default_factory=dict)  # call_id -> byte offset of its line
    payloads: dict[str, tuple[dict[str, Any], dict[str, Any] | None]] = field(default_factory=dict)  # format 2
    responses: dict[str, dict[str, Any] | None] = field(default_factory=dict)  # read without payloads

    @property
    def task_id(self) -> str:
        return self.file.task_id

    @property
    def session_id(self) -> str:
        return self.file.session_id

    def payload(self, call_id: str) -> tuple[dict[str, Any], dict[str, Any] | None]:
        """(request, response) of one call: kept from a linear (format 2) line, else read back from its line."""
        if call_id in self.payloads:
            return self.payloads[call_id]
        if call_id not in self.offsets:  # a session built in memory (no file): its records carry what it has
            return {}, None
        with open(self.file.path, "rb") as f:
            f.seek(self.offsets[call_id])
            data = _without_prompt(f.readline())
        return data.get("request") or {}, data.get("response")

    def response(self, call_id: str) -> dict[str, Any] | None:
        """The response of one call, without reading its line again when the first read kept it."""
        if call_id in self.payloads:
            return self.payloads[call_id][1]
        if call_id in self.responses:
            return self.responses[call_id]
        return self.payload(call_id)[1]


def _without_prompt(line: bytes) -> dict[str, Any]:
    """A line parsed without its prompt_ids array (most of a long session's format-1 line, and not needed
    for a payload), or whole when that cut cannot be trusted."""
    cut = without_prompt_ids(line)
    return cut[0] if cut is not None else loads_line(line)


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


def read_session(sf: SessionFile, payloads: bool = False, strict: bool = True) -> CapturedSession:
    """All records of one capture file (either format), validated. strict: raise on the first bad line;
    otherwise skip it and note why in `problems`. A torn last line (the writer died mid-line) is always
    skipped. Each line's ids are parsed and checked once: a linear line's prefix is shared, not re-read."""
    session = CapturedSession(sf, [])
    decoder = CaptureDecoder(sf.path)
    seen: set[str] = set()
    for offset, lineno, data, stored in decoder.lines(payloads):
        response = data.get("response")  # decode() drops it when payloads is False
        try:
            record = decoder.decode(data, payload=payloads, stored=stored)
            problems = validate(record, sf, seen, stored if type(stored) in (list, tuple) else None)
            if problems:
                decoder.drop(record)
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
        if not payloads:
            session.responses[record.call_id] = response
    if not payloads:
        session.payloads = decoder.payloads
    return session


def iter_sessions(files: list[SessionFile], payloads: bool = False, strict: bool = True) -> Iterator[CapturedSession]:
    for sf in files:
        yield read_session(sf, payloads=payloads, strict=strict)


def validate(record: CallRecord, sf: SessionFile, seen: set[str], stored: Sequence[int] | None = None) -> list[str]:
    """What is wrong with one record in its file; empty when it is usable. `stored`: the prompt ids its
    line stored (a linear line's prefix was checked on the line it came from)."""
    problems = []
    prompt = record.prompt_ids if stored is None else stored
    if record.task_id != sf.task_id or record.session_id != sf.session_id:
        problems.append(f"call {record.call_id} says {record.task_id}/{record.session_id}, "
                        f"its file is {sf.task_id}/{sf.session_id}")
    if record.call_id in seen:
        problems.append(f"duplicate call_id {record.call_id}")
    if min(prompt, default=0) < 0 or min(record.output_ids, default=0) < 0:
        problems.append(f"call {record.call_id}: negative token id")
    if max(prompt, default=0) > MAX_TOKEN_ID or max(record.output_ids, default=0) > MAX_TOKEN_ID:
        problems.append(f"call {record.call_id}: token id above {MAX_TOKEN_ID} (the table stores int32)")
    if not all(map(math.isfinite, record.output_logprobs)):
        problems.append(f"call {record.call_id}: non-finite logprob")
    if record.error is None and not record.prompt_ids:
        problems.append(f"call {record.call_id}: no prompt_ids on a call without error")
    return problems
