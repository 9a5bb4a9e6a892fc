"""Capture files in the linear form (capture_version 2; docs/captures.md): a session's file grows with the
tokens and request text that are new in each call, not with the whole history again.

A line may carry two references to an earlier line of the same file:
- `prompt_prefix: {call_id, length}`: this call's prompt_ids are the first `length` ids of that call's
  `prompt_ids + output_ids`, followed by the ids stored in this line's `prompt_ids`;
- `request_base: {call_id, keys, same, extend}`: this call's request has the keys `keys` in that order;
  a key in `same` holds that call's value, a key in `extend` (name -> n) holds the first n items of that
  call's list followed by the items stored here, any other key is stored here.
Lines without `capture_version` are format 1 (every line self-contained) and read unchanged.
"""
from __future__ import annotations

import json
import os
from collections import OrderedDict, deque
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Iterator, Sequence

import orjson

from .records import CallRecord, record_path

CAPTURE_VERSION = 2
MIN_PREFIX = 32  # shorter shared prefixes are stored in full
RECENT = 8  # records per session a writer compares a new record against
_FIELDS = tuple(f.name for f in fields(CallRecord))
_OPTIONAL = frozenset({"error", "flags"})
_REQUIRED = frozenset(_FIELDS) - _OPTIONAL


def dumps_line(obj: dict[str, Any]) -> bytes:
    """Compact JSON; text that is not valid Unicode (a lone surrogate) is kept as a `\\udXXX` escape."""
    try:
        return orjson.dumps(obj)
    except TypeError:  # orjson refuses lone surrogates (and ints past 64 bits): the stdlib escapes them
        return json.dumps(obj, separators=(",", ":"), ensure_ascii=True).encode("ascii")


def loads_line(line: bytes) -> Any:
    try:
        return orjson.loads(line)
    except orjson.JSONDecodeError:  # orjson refuses `\udXXX` escapes of lone surrogates; json takes them
        return json.loads(line)


@dataclass(frozen=True)
class Written:
    """What a writer remembers of a record it wrote: enough to reference it from a later line."""

    call_id: str
    api: str
    tokens: tuple[int, ...]  # prompt_ids + output_ids
    request: dict[str, Any]


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two id sequences (compared in C, block by block)."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, step = 0, 1024
    while step:
        while lo + step <= n and a[lo:lo + step] == b[lo:lo + step]:
            lo += step
        step //= 8
    return lo


def _prefix_of(record: CallRecord, recent: Sequence[Written]) -> tuple[Written, int] | None:
    """The remembered record whose tokens share the longest prefix with this prompt (the proxy's parent
    first, then newest first); None below MIN_PREFIX."""
    prompt = record.prompt_ids
    order = sorted(reversed(recent), key=lambda w: w.call_id != record.parent_call_id)
    best: tuple[Written, int] | None = None
    for w in order:
        if min(len(prompt), len(w.tokens)) <= (best[1] if best else MIN_PREFIX - 1):
            continue  # cannot share more than the best so far
        n = len(w.tokens)
        if n <= len(prompt) and prompt[n - 1] == w.tokens[-1] and prompt[:n] == w.tokens:
            k = n
        else:
            k = common_prefix(prompt, w.tokens)
        if k > (best[1] if best else MIN_PREFIX - 1):
            best = (w, k)
    return best


def _common_items(a: list[Any], b: list[Any]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x is not y and x != y:
            break
        n += 1
    return n


def request_delta(request: dict[str, Any], base: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """(request_base without call_id, what this line stores) or None when nothing is shared."""
    same: list[str] = []
    extend: dict[str, int] = {}
    stored: dict[str, Any] = {}
    for key, value in request.items():
        old = base.get(key)
        if type(value) is list and type(old) is list and value and old:
            n = _common_items(value, old)
            if n == len(value) == len(old):
                same.append(key)
            elif n:
                extend[key], stored[key] = n, value[n:]
            else:
                stored[key] = value
        elif (type(value) in (dict, list) and value or type(value) is str and len(value) >= 64) and value == old:
            same.append(key)
        else:
            stored[key] = value
    if not same and not extend:
        return None
    return {"keys": list(request), "same": same, "extend": extend}, stored


def encode_record(record: CallRecord, recent: Sequence[Written]) -> dict[str, Any]:
    """The line of one record in the linear form, given the records already written to its file."""
    line: dict[str, Any] = {"capture_version": CAPTURE_VERSION}
    for name in _FIELDS:
        line[name] = getattr(record, name)
    prefix = _prefix_of(record, recent) if record.prompt_ids else None
    if prefix is not None:
        ref, n = prefix
        line = _insert_before(line, "prompt_ids", "prompt_prefix", {"call_id": ref.call_id, "length": n})
        line["prompt_ids"] = record.prompt_ids[n:]
    base = _request_base(record, recent, prefix[0] if prefix else None)
    if base is not None:
        meta, stored = base
        line = _insert_before(line, "request", "request_base", meta)
        line["request"] = stored
    return line


def _request_base(record: CallRecord, recent: Sequence[Written],
                  ref: Written | None) -> tuple[dict[str, Any], dict[str, Any]] | None:
    if not record.request:
        return None
    same_api = [w for w in reversed(recent) if w.api == record.api and w.request]
    if ref is not None and ref in same_api:
        same_api.remove(ref)
        same_api.insert(0, ref)
    for w in same_api[:2]:
        delta = request_delta(record.request, w.request)
        if delta is not None:
            return {"call_id": w.call_id, **delta[0]}, delta[1]
    return None


def _insert_before(line: dict[str, Any], key: str, new_key: str, value: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in line.items():
        if k == key:
            out[new_key] = value
        out[k] = v
    return out


class CaptureWriter:
    """Appends CallRecords to `<capture_dir>/<task_id>/<session_id>.jsonl` in the linear form. Each line is
    flushed and fsynced before write() returns. It references only lines this writer wrote to that file
    (a restarted proxy, or a session it forgot, starts again with a self-contained line)."""

    def __init__(self, capture_dir: str | os.PathLike, recent: int = RECENT, max_sessions: int = 1024,
                 fsync: bool = True) -> None:
        self.capture_dir = Path(capture_dir)
        self.recent, self.max_sessions, self.fsync = recent, max_sessions, fsync
        self._sessions: OrderedDict[Path, tuple[deque[Written], list[int]]] = OrderedDict()
        self._dirs: set[Path] = set()

    def write(self, record: CallRecord) -> Path:
        path = record_path(self.capture_dir, record.task_id, record.session_id)
        if path.parent not in self._dirs:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._dirs.add(path.parent)
        recent, size = self._state(path)
        try:
            with open(path, "ab") as f:
                if f.tell() < size[0]:  # the file was replaced or cut: earlier lines are not there to refer to
                    recent.clear()
                f.write(dumps_line(encode_record(record, recent)) + b"\n")
                f.flush()
                if self.fsync:
                    os.fsync(f.fileno())
                size[0] = f.tell()
        except BaseException:
            self._sessions.pop(path, None)
            raise
        recent.append(Written(record.call_id, record.api, record.prompt_ids + record.output_ids, record.request))
        return path

    def forget(self, task_id: str, session_id: str) -> None:
        """Drop what this writer remembers of a session (it ended); later lines start self-contained."""
        self._sessions.pop(record_path(self.capture_dir, task_id, session_id), None)

    def _state(self, path: Path) -> tuple[deque[Written], list[int]]:
        state = self._sessions.get(path)
        if state is None:
            state = self._sessions[path] = (deque(maxlen=self.recent), [0])
            while len(self._sessions) > self.max_sessions:
                self._sessions.popitem(last=False)
        else:
            self._sessions.move_to_end(path)
        return state
