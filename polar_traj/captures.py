"""Capture files in the linear form (capture_version 2; docs/captures.md): a session's file grows with the
tokens and request text that are new in each call, not with the whole history again.

A line may carry two references to an earlier line of the same file:
- `prompt_prefix: {call_id, length}`: this call's prompt_ids are the first `length` ids of that call's
  `prompt_ids + output_ids`, followed by the ids stored in this line's `prompt_ids`;
- `request_base: {call_id, keys, same, extend}`: this call's request has the keys `keys` in that order;
  a key in `same` holds that call's value, a key in `extend` (name -> n) holds the first n items of that
  call's list followed by the items stored here, any other key is stored here.
A reference may instead name a shared prefix (`{"shared": <digest>, ...}`): a file in `<capture_dir>/_shared/`
holding the ids and request parts that many sessions' first calls share (the harness's system prompt and tools),
stored once instead of in every session's first line.
Lines without `capture_version` are format 1 (every line self-contained) and read unchanged.
"""
from __future__ import annotations

import hashlib
import json
import os
from array import array
from collections import OrderedDict, deque
from dataclasses import dataclass, fields
from pathlib import Path
from functools import partial
from typing import Any, Callable, Sequence

import orjson

from .records import CallRecord, plain_ids, record_path
from .shared_prefix import SHARED_DIR, SHARED_VERSION, write_shared
from .shared_prefix import copy_capture, shared_files  # noqa: F401 (re-exported: a capture file travels with them)

CAPTURE_VERSION = 2
MIN_PREFIX = 32  # shorter shared prefixes are stored in full
RECENT = 4  # records per session a writer compares a new record against
MIN_SHARED = 1024  # ids a record must share with other sessions' records before a shared prefix is used
SHARED_ENTRIES = 64  # shared prefixes a writer remembers (the least recently used go first)
FIRSTS = 8  # records without an own-session prefix a writer compares a new one against, to find new shared prefixes
_FIELDS = tuple(f.name for f in fields(CallRecord))
# every ASCII digit becomes "0", anything else " ": then 19 digits in a row (which may pass 2**63) are one
# substring search, at memchr speed (a regex scan costs ~50 ns a byte: ~4 ms for a 75 KB request)
_DIGIT_MAP = bytes(0x30 if 0x30 <= i <= 0x39 else 0x20 for i in range(256))
_LONG_DIGITS = b"0" * 19


def dumps_line(obj: dict[str, Any]) -> bytes:
    """Compact JSON; text that is not valid Unicode (a lone surrogate) is kept as a `\\udXXX` escape. An id
    array('i') (the proxy's prompts) is written from its buffer, as numpy's int32: no Python int per id."""
    try:
        return orjson.dumps(obj, default=_int32_view, option=orjson.OPT_SERIALIZE_NUMPY)
    except TypeError:  # orjson refuses lone surrogates (and ints past 64 bits): the stdlib escapes them
        return json.dumps(obj, separators=(",", ":"), ensure_ascii=True, default=plain_ids).encode("ascii")


def _is_int32(ids: Any) -> bool:
    """An array('i') of 4-byte ints: its buffer is already the int32 ids."""
    return isinstance(ids, array) and ids.typecode == "i" and ids.itemsize == 4


def _int32_view(value: Any) -> Any:
    if _is_int32(value):
        import numpy as np  # pyarrow's dependency; loaded on the first array written

        return np.frombuffer(value, dtype=np.int32) if len(value) else []
    return plain_ids(value)


def loads_line(line: bytes) -> Any:
    if _LONG_DIGITS in line.translate(_DIGIT_MAP):  # orjson reads an int past 64 bits as a float; json keeps it
        return json.loads(line)
    try:
        return orjson.loads(line)
    except orjson.JSONDecodeError:  # orjson refuses `\udXXX` escapes of lone surrogates; json takes them
        return json.loads(line)


@dataclass(frozen=True)
class Written:
    """What a writer remembers of a record it wrote: enough to reference it from a later line."""

    call_id: str
    api: str
    tokens: bytes  # prompt_ids + output_ids as native int32 (4 bytes an id: compared with memcmp)
    request: dict[str, Any]
    weight: int = 0  # about the bytes this holds (its ids, its request as JSON), for the writer's memory bound


@dataclass(frozen=True)
class Shared:
    """A prefix that several sessions' records share, stored once in `<capture_dir>/_shared/<digest>.json`."""

    digest: str  # blake2b (16 bytes) of the file's bytes, in hex: the file's name
    api: str
    tokens: bytes  # its ids as int32
    request: dict[str, Any]  # the request parts those records share
    weight: int  # about the bytes this holds, for the writer's memory bound


def id_bytes(ids: Sequence[int]) -> bytes | None:
    """Ids as int32 bytes, or None when one does not fit (such a record is never referred to)."""
    if _is_int32(ids):
        return ids.tobytes()
    try:
        return array("i", ids).tobytes()
    except (OverflowError, TypeError):
        return None


def common_prefix(a: bytes, b: bytes) -> int:
    """Length in ids of the longest common prefix of two int32 id strings (memcmp, block by block)."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n // 4
    lo, step = 0, 4096
    while step >= 4:
        while lo + step <= n and a[lo:lo + step] == b[lo:lo + step]:
            lo += step
        step //= 4
    return lo // 4


def _prefix_of(prompt: bytes, parent_call_id: str | None, recent: Sequence[Written]) -> tuple[Written, int] | None:
    """The remembered record whose ids share the longest prefix with this prompt (the proxy's parent
    first, then newest first); None below MIN_PREFIX."""
    order = sorted(reversed(recent), key=lambda w: w.call_id != parent_call_id)
    best: tuple[Written, int] | None = None
    for w in order:
        if min(len(prompt), len(w.tokens)) // 4 <= (best[1] if best else MIN_PREFIX - 1):
            continue  # cannot share more than the best so far
        k = len(w.tokens) // 4 if prompt.startswith(w.tokens) else common_prefix(prompt, w.tokens)
        if k > (best[1] if best else MIN_PREFIX - 1):
            best = (w, k)
    return best


def _common_items(a: list[Any], b: list[Any]) -> int:
    if len(a) >= len(b) and a[: len(b)] == b:
        return len(b)
    n = 0
    for x, y in zip(a, b):
        if x is not y and x != y:
            break
        n += 1
    return n


def _worth_referring(value: Any) -> bool:
    """A top-level request value a reference may stand for: a non-empty object or list, or a long string
    (small values cost less stored than referred to)."""
    return type(value) in (dict, list) and bool(value) or type(value) is str and len(value) >= 64


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
        elif _worth_referring(value) and value == old:
            same.append(key)
        else:
            stored[key] = value
    if not same and not extend:
        return None
    return {"keys": list(request), "same": same, "extend": extend}, stored


def shared_request(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """What a shared prefix keeps of two requests: the top-level values both hold that are worth referring
    to (as request_delta takes them) and the common leading items of lists (messages, input, contents)."""
    out: dict[str, Any] = {}
    for key, value in a.items():
        old = b.get(key)
        if type(value) is list and type(old) is list:
            n = _common_items(value, old)
            if n:
                out[key] = value[:n]
        elif _worth_referring(value) and value == old:
            out[key] = value
    return out


def _shared_length(prompt: bytes, tokens: bytes) -> int:
    """Ids a prompt shares with a shared prefix (or another prompt), or 0 when fewer than MIN_SHARED: the
    first MIN_SHARED ids are compared alone first, so an unrelated prompt costs a 4 KB compare."""
    if len(tokens) < 4 * MIN_SHARED or not prompt.startswith(tokens[: 4 * MIN_SHARED]):
        return 0
    return len(tokens) // 4 if prompt.startswith(tokens) else common_prefix(prompt, tokens)


def encode_record(record: CallRecord, recent: Sequence[Written], prompt: bytes | None = None,
                  share: Callable[[int], tuple[Shared, int] | None] | None = None) -> dict[str, Any]:
    """The line of one record in the linear form, given the records already written to its file.
    `prompt`: its prompt_ids as id_bytes (None: the prompt is stored whole). `share`: given how many ids the
    file's own lines share with the prompt, a shared prefix and how many of its ids the prompt begins with
    (or None); it is used when it has more."""
    line: dict[str, Any] = {"capture_version": CAPTURE_VERSION}
    for name in _FIELDS:
        line[name] = getattr(record, name)
    prefix = _prefix_of(prompt, record.parent_call_id, recent) if prompt else None
    shared = share(prefix[1] if prefix else 0) if share is not None and prompt else None
    if shared is not None and (prefix is None or prefix[1] < shared[1]):
        entry, n = shared
        line = _insert_before(line, "prompt_ids", "prompt_prefix", {"shared": entry.digest, "length": n})
        line["prompt_ids"] = record.prompt_ids[n:]
        delta = request_delta(record.request, entry.request) if record.request and entry.request else None
        base = ({"shared": entry.digest, **delta[0]}, delta[1]) if delta else _request_base(record, recent, None)
    elif prefix is not None:
        ref, n = prefix
        line = _insert_before(line, "prompt_ids", "prompt_prefix", {"call_id": ref.call_id, "length": n})
        line["prompt_ids"] = record.prompt_ids[n:]
        base = _request_base(record, recent, ref)
    else:
        base = _request_base(record, recent, None)
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
    flushed (and fsynced) before write() or write_many() returns. It refers only to lines this writer wrote to that file
    (a restarted proxy, or a session it forgot, starts again with a self-contained line) and remembers
    the last `recent` records of at most `max_sessions` sessions (4 bytes an id, plus their requests).
    shared=True: a record that shares fewer than MIN_SHARED ids with its own file's lines may refer to a
    shared prefix instead (one it wrote, or a new one made of what it shares with another session's record)."""

    def __init__(self, capture_dir: str | os.PathLike, recent: int = RECENT, max_sessions: int = 1024,
                 fsync: bool = True, max_bytes: int | None = None, shared: bool = False) -> None:
        self.capture_dir = Path(capture_dir)
        self.recent, self.max_sessions, self.fsync, self.max_bytes = recent, max_sessions, fsync, max_bytes
        self.shared = shared
        self._sessions: OrderedDict[tuple[str, str], _SessionState] = OrderedDict()
        self._bytes = 0  # the weight of every remembered record (max_bytes: least recent sessions forgotten)
        self._prefixes: OrderedDict[str, Shared] = OrderedDict()  # shared prefixes written, least recently used first
        self._firsts: deque[Written] = deque(maxlen=FIRSTS)  # recent records that had no own-file prefix: their prompts
        self._shared_bytes = 0  # the weight of both (max_bytes: at most a quarter of it once sessions compete)

    def write(self, record: CallRecord, extends: int | None = None) -> Path:
        """Append one record; the path of its file. `extends`: the caller vouches that the prompt begins with
        exactly the `prompt_ids + output_ids` of call `record.parent_call_id`, that many ids (the proxy
        builds a history-substituted prompt that way). The ids are then checked only at the seam, so the
        cost is in the new ids; without it (or when that call is not remembered) all are compared."""
        (result,) = self.write_many([(record, extends)])
        if isinstance(result, BaseException):
            raise result
        return result

    def write_many(self, items: Sequence[tuple[CallRecord, int | None]]) -> list[Path | Exception]:
        """Append several records (a group commit): each session's lines in the order given, its file opened,
        flushed and fsynced once. Per item its file's path, or the error that kept its session's lines
        from being made durable (then none of that session's lines in this batch count as written)."""
        groups: dict[tuple[str, str], list[int]] = {}
        for i, (record, _) in enumerate(items):
            groups.setdefault((record.task_id, record.session_id), []).append(i)
        results: list[Path | Exception] = [Path()] * len(items)
        for key, where in groups.items():
            try:
                path = self._append(key, [items[i] for i in where])
            except Exception as e:  # disk full, unsafe ids, unencodable text: this session's lines only
                self._drop(key)
                for i in where:
                    results[i] = e
                continue
            for i in where:
                results[i] = path
        self._trim()
        return results

    def _trim(self) -> None:
        """Forget until what is remembered fits max_bytes: the least recent sessions, then (or first, past a
        quarter of the bound) older first records and the least recently used shared prefixes."""
        while self.max_bytes is not None and self._bytes + self._shared_bytes > self.max_bytes:
            if (self._shared_bytes > self.max_bytes // 4 or len(self._sessions) <= 1) and self._shared_bytes:
                # the newest first record is kept longest: the next session's first call may share with it
                if len(self._firsts) > 1 or not self._prefixes:
                    self._shared_bytes -= self._firsts.popleft().weight
                else:
                    self._shared_bytes -= self._prefixes.popitem(last=False)[1].weight
            elif len(self._sessions) > 1:
                self._drop(next(iter(self._sessions)))
            else:
                return

    def _append(self, key: tuple[str, str], items: Sequence[tuple[CallRecord, int | None]]) -> Path:
        state = self._state(*key)
        with open(state.path, "ab") as f:
            if f.tell() < state.size:  # the file was replaced or cut: earlier lines are not there to refer to
                self._forget_lines(state)
            start = f.tell()
            try:
                self._lines(f, state, items)
                f.flush()
                if self.fsync:
                    os.fsync(f.fileno())
            except BaseException:  # the caller is told these lines failed: none of them may stay behind
                try:
                    f.truncate(start)
                except OSError:
                    pass
                raise
            state.size = f.tell()
        return state.path

    def _lines(self, f: Any, state: "_SessionState", items: Sequence[tuple[CallRecord, int | None]]) -> None:
        """Each record's line into `f`, and what the session remembers of it for later lines."""
        for record, extends in items:
            prompt = _vouched(record, extends, state.recent) if extends else None
            if prompt is None:
                prompt = id_bytes(record.prompt_ids)
            share = partial(self._share, record, prompt) if self.shared and prompt is not None else None
            line = encode_record(record, state.recent, prompt, share)
            data = dumps_line(line)
            f.write(data + b"\n")
            if share is not None:
                self._remember_first(record, prompt, line, len(data))
            output = id_bytes(record.output_ids)
            if prompt is not None and output is not None:
                base = line.get("request_base") or {}  # a shared base's weight is the shared entry's
                old = next((w.weight for w in state.recent if w.call_id == base.get("call_id")), 0)
                weight = len(prompt) + len(output) + old + len(data)  # a delta line's request is its base's + it
                if len(state.recent) == state.recent.maxlen:
                    self._bytes -= state.recent[0].weight
                state.recent.append(Written(record.call_id, record.api, prompt + output, record.request, weight))
                self._bytes += weight

    def _share(self, record: CallRecord, prompt: bytes, own: int) -> tuple[Shared, int] | None:
        """The shared prefix this record's line should refer to, and how many of its ids it takes (a new one is
        written first), or None: the record shares `own` >= MIN_SHARED ids with its own file, or too few
        with other sessions' records."""
        if own >= MIN_SHARED or len(prompt) < 4 * MIN_SHARED:
            return None
        api = record.api
        # most recent first, and max() keeps the first of equals: sessions 2..N all take the same one
        known = max(((e, _shared_length(prompt, e.tokens)) for e in reversed(self._prefixes.values()) if e.api == api),
                    key=lambda x: x[1], default=(None, 0))
        other = max(((w, _shared_length(prompt, w.tokens)) for w in reversed(self._firsts) if w.api == api),
                    key=lambda x: x[1], default=(None, 0))
        k = known[1] if known[1] >= MIN_SHARED else 0
        # a new file costs its ids once and saves only what it adds for each later session: not for a few
        # more ids (a task's own text, shared by its group's samples), but when the known one is far shorter
        if other[1] >= max(MIN_SHARED, 2 * k):
            return self._new_shared(record, other[0], prompt[:4 * other[1]]), other[1]
        if k:
            self._prefixes.move_to_end(known[0].digest)
            return known[0], k
        return None

    def _new_shared(self, record: CallRecord, other: Written, tokens: bytes) -> Shared:
        """Write (durably, before any line refers to it) the shared prefix of `tokens` and the request parts
        this record shares with `other`, and remember it."""
        request = shared_request(record.request or {}, other.request or {})
        data = dumps_line({"shared_version": SHARED_VERSION, "api": record.api,
                           "ids": record.prompt_ids[: len(tokens) // 4], "request": request})
        digest = hashlib.blake2b(data, digest_size=16).hexdigest()
        write_shared(self.capture_dir / SHARED_DIR / f"{digest}.json", data, self.fsync)
        entry = self._prefixes.pop(digest, None)
        if entry is None:
            entry = Shared(digest, record.api, tokens, request, len(tokens) + len(data))
            self._shared_bytes += entry.weight
        self._prefixes[digest] = entry
        while len(self._prefixes) > SHARED_ENTRIES:
            self._shared_bytes -= self._prefixes.popitem(last=False)[1].weight
        return entry

    def _remember_first(self, record: CallRecord, prompt: bytes, line: dict[str, Any], size: int) -> None:
        """Keep the prompt of a record its own file shared little with, for a later session's first record
        to find a new shared prefix in."""
        own, base = line.get("prompt_prefix"), line.get("request_base") or {}
        if len(prompt) < 4 * MIN_SHARED or own is not None and "call_id" in own and own["length"] >= MIN_SHARED:
            return
        entry = self._prefixes.get(base.get("shared", ""))
        weight = len(prompt) + size + (entry.weight if entry else 0)  # its request is the shared one's + its line's
        if len(self._firsts) == self._firsts.maxlen:
            self._shared_bytes -= self._firsts[0].weight
        self._firsts.append(Written(record.call_id, record.api, prompt, record.request, weight))
        self._shared_bytes += weight

    def forget(self, task_id: str, session_id: str) -> None:
        """Drop what this writer remembers of a session (it ended); later lines start self-contained."""
        self._drop((task_id, session_id))

    def _drop(self, key: tuple[str, str]) -> None:
        state = self._sessions.pop(key, None)
        if state is not None:
            self._forget_lines(state)

    def _forget_lines(self, state: "_SessionState") -> None:
        self._bytes -= sum(w.weight for w in state.recent)
        state.recent.clear()

    def _state(self, task_id: str, session_id: str) -> "_SessionState":
        key = (task_id, session_id)
        state = self._sessions.get(key)
        if state is not None:
            self._sessions.move_to_end(key)
            return state
        path = record_path(self.capture_dir, task_id, session_id)
        path.parent.mkdir(parents=True, exist_ok=True)
        state = self._sessions[key] = _SessionState(path, deque(maxlen=self.recent))
        while len(self._sessions) > self.max_sessions:
            self._drop(next(iter(self._sessions)))
        return state


def _vouched(record: CallRecord, extends: int, recent: Sequence[Written]) -> bytes | None:
    """The prompt's id bytes from its parent's remembered ids and its own new ids, or None when the parent
    is not remembered or the ids around the seam disagree."""
    parent = next((w for w in recent if w.call_id == record.parent_call_id), None)
    if parent is None or len(parent.tokens) != 4 * extends or extends > len(record.prompt_ids):
        return None
    seam = max(0, extends - 16)
    if id_bytes(record.prompt_ids[seam:extends]) != parent.tokens[4 * seam:]:
        return None
    new = id_bytes(record.prompt_ids[extends:])
    return None if new is None else parent.tokens + new


@dataclass
class _SessionState:
    path: Path
    recent: deque[Written]
    size: int = 0  # the file's size after this writer's last line
