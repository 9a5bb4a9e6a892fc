"""Reading capture files of either format (docs/captures.md) into full CallRecords, each line's ids parsed
once: a linear (format 2) line stores only its new ids; in a format-1 line the prompt's JSON text usually
starts with the text of a recent line's prompt, and then only the rest of the array is parsed."""
from __future__ import annotations

import hashlib
import json
import os
from collections import deque
from dataclasses import fields
from pathlib import Path
from typing import Any, Iterator


from .captures import CAPTURE_VERSION, loads_line
from .records import OPTIONAL_FIELDS, CallRecord
from .shared_prefix import DIGEST, SHARED_VERSION, shared_path

_FIELDS = tuple(f.name for f in fields(CallRecord))
_REQUIRED = frozenset(_FIELDS) - OPTIONAL_FIELDS
_PROMPT_KEY = b'"prompt_ids":'
_LINEAR = b'{"capture_version"'
_INT_TEXT = b"0123456789-, \t\r\n"  # what a JSON array of integers holds between its brackets
_REQUEST_KEY, _RESPONSE_KEY = b'"request":', b'"response":'
RECENT_TEXTS = 4  # format-1 prompt texts a decoder compares a new line's prompt text against
MAX_TOKEN_ID = 2**31 - 1

Payload = tuple[dict[str, Any], dict[str, Any] | None]


class CaptureDecoder:
    """Turns the lines of one capture file, in order, into full CallRecords (both formats). Keeps each
    record (its ids) and, for linear lines, the rebuilt request and response."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = path
        self.records: dict[str, CallRecord] = {}
        self.payloads: dict[str, Payload] = {}
        self._texts: deque[tuple[bytes, tuple[int, ...]]] = deque(maxlen=RECENT_TEXTS)  # (text less "]", ids)
        self._shared: dict[str, tuple[tuple[int, ...], dict[str, Any]]] = {}  # digest -> (ids, request), read once

    def lines(self, payload: bool = True) -> Iterator[tuple[int, int, dict[str, Any], list[int] | None]]:
        """(byte offset, line number, parsed object, prompt ids parsed from this line) per non-blank line.
        A torn last line (the writer died mid-line: it lacks its newline) is skipped. payload=False: a
        format-1 line's request may be left unparsed (None)."""
        offset = 0
        with open(self.path, "rb", buffering=1 << 20) as f:
            for lineno, line in enumerate(f, 1):
                start, offset = offset, offset + len(line)
                if line.isspace():
                    continue
                try:
                    data, stored = self.parse(line, payload)
                except json.JSONDecodeError as e:
                    if not line.endswith(b"\n"):
                        return
                    raise ValueError(f"{self.path}:{lineno}: not a JSON record ({e})") from e
                if not isinstance(data, dict):
                    raise ValueError(f"{self.path}:{lineno}: a record must be a JSON object")
                yield start, lineno, data, stored

    def parse(self, line: bytes, payload: bool = True) -> tuple[dict[str, Any], list[int] | None]:
        """The parsed line and the prompt ids parsed from it (format 1: past a recent prompt's text; with
        payload=False, the request is cut out unparsed)."""
        cut = None if line.startswith(_LINEAR) else without_prompt_ids(line, payload)
        if cut is None:
            data = loads_line(line)
            return data, data.get("prompt_ids") if isinstance(data, dict) else None
        data, text = cut
        ids, stored = self._prompt_text(text)
        data["prompt_ids"] = ids
        return data, stored

    def _prompt_text(self, text: bytes) -> tuple[tuple[int, ...] | list[Any], tuple[int, ...] | list[Any]]:
        """(prompt ids, the ids parsed here): a tuple when they are all integers (the JSON text has nothing
        but digits, signs, commas and blanks), else what JSON made of them, for the slow path to refuse."""
        for old, old_ids in self._texts:
            head = len(old)
            if len(text) > head and text.startswith(old) and text[head] in b",]":
                inner = text[head + 1:-1]
                break
        else:
            old_ids, inner = (), text[1:-1]
        stored = loads_line(b"[" + inner + b"]")
        if inner.translate(None, _INT_TEXT) or type(stored) is not list:
            return (list(old_ids) + stored if old_ids else stored), stored
        stored = tuple(stored)
        ids = old_ids + stored
        self._texts.appendleft((text[:-1], ids))
        return ids, stored

    def decode(self, data: dict[str, Any], payload: bool = True, stored: Any = None) -> CallRecord:
        """The record of one parsed line. payload=False: its request/response are left empty in the record
        (format 2 keeps them in `payloads`, format 1 drops them). `stored`: the prompt ids the line held."""
        version = data.get("capture_version", 1)
        if version not in (1, CAPTURE_VERSION):
            raise ValueError(f"capture_version {version!r}: this reader knows 1 and {CAPTURE_VERSION}")
        call_id = data.get("call_id", "?")
        if version == CAPTURE_VERSION:
            if data.get("prompt_prefix") is not None:
                data["prompt_ids"] = self._prompt(call_id, data["prompt_prefix"], data.get("prompt_ids"))
            if data.get("request_base") is not None:
                data["request"] = self._request(call_id, data["request_base"], data.get("request"))
            self.payloads.setdefault(call_id, (data.get("request") or {}, data.get("response")))
        if not payload:
            data["request"], data["response"] = {}, None
        record = record_from_dict(data, stored)
        self.records.setdefault(record.call_id, record)  # a duplicate id never replaces the first
        return record

    def drop(self, record: CallRecord) -> None:
        """Forget a record its reader refused, so later lines cannot build on it."""
        if self.records.get(record.call_id) is record:
            del self.records[record.call_id]
            self.payloads.pop(record.call_id, None)
        self._texts = deque(((t, ids) for t, ids in self._texts if ids is not record.prompt_ids), maxlen=RECENT_TEXTS)

    def _ref(self, call_id: str, ref: Any, what: str) -> tuple[str, tuple[int, ...], tuple[int, ...], dict[str, Any]]:
        """What a reference names, as (its name in errors, prompt ids, output ids, request): an earlier call
        of this file, or a shared prefix (exactly one of the two)."""
        if isinstance(ref, dict) and "shared" in ref:
            if "call_id" in ref:
                raise ValueError(f"call {call_id}: {what} names both a call and a shared prefix")
            ids, request = self._shared_prefix(call_id, ref["shared"], what)
            return f"shared prefix {ref['shared']}", ids, (), request
        target = self.records.get(ref.get("call_id")) if isinstance(ref, dict) else None
        if target is None:
            name = ref.get("call_id") if isinstance(ref, dict) else ref
            raise ValueError(f"call {call_id}: {what} refers to call {name!r}, "
                             f"which is not on an earlier line of {self.path}")
        request = self.payloads.get(target.call_id, ({}, None))[0]
        return f"call {target.call_id}", target.prompt_ids, target.output_ids, request

    def _shared_prefix(self, call_id: str, digest: Any, what: str) -> tuple[tuple[int, ...], dict[str, Any]]:
        found = self._shared.get(digest) if isinstance(digest, str) else None
        if found is not None:
            return found
        if not isinstance(digest, str) or not DIGEST.fullmatch(digest):
            raise ValueError(f"call {call_id}: {what} names no shared prefix ({digest!r} is not a digest)")
        path = shared_path(self.path, digest)
        try:
            found = self._shared[digest] = read_shared(path, digest)
        except ValueError as e:
            raise ValueError(f"call {call_id}: {what} refers to shared prefix {digest!r}, {e}") from e
        return found

    def _prompt(self, call_id: str, prefix: Any, new_ids: Any) -> tuple[int, ...]:
        name, head, tail = self._ref(call_id, prefix, "prompt_prefix")[:3]
        n = prefix.get("length")
        if type(n) is not int or not 0 <= n <= len(head) + len(tail):
            raise ValueError(f"call {call_id}: prompt_prefix length {n!r} is not within "
                             f"{name}'s {len(head) + len(tail)} ids")
        if type(new_ids) is not list:
            raise ValueError(f"call {call_id}: prompt_ids must be a list")
        start = head[:n] if n <= len(head) else head + tail[: n - len(head)]
        return start + tuple(new_ids)

    def _request(self, call_id: str, base: Any, stored: Any) -> dict[str, Any]:
        name, _, _, old = self._ref(call_id, base, "request_base")
        keys, same, extend = base.get("keys"), base.get("same") or [], base.get("extend") or {}
        if type(keys) is not list or type(stored) is not dict:
            raise ValueError(f"call {call_id}: request_base needs a list of keys and a request object")
        out: dict[str, Any] = {}
        for key in keys:
            if key in same and key in old:
                out[key] = old[key]
            elif key in extend and type(old.get(key)) is list and type(stored.get(key)) is list:
                out[key] = old[key][: extend[key]] + stored[key]
            elif key in stored:
                out[key] = stored[key]
            else:
                raise ValueError(f"call {call_id}: request key {key!r} is neither stored "
                                 f"nor in {name}'s request")
        return out


def read_shared(path: Path, digest: str) -> tuple[tuple[int, ...], dict[str, Any]]:
    """(ids, request) of a shared-prefix file, once its bytes match their digest (its name). ValueError
    (`which is missing: PATH`, ...) completes a sentence about the reference that named it."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise ValueError(f"which is missing: {path}") from None
    except OSError as e:
        raise ValueError(f"which cannot be read: {path} ({e.strerror})") from e
    if hashlib.blake2b(data, digest_size=16).hexdigest() != digest:
        raise ValueError(f"whose file does not match its digest (changed or cut): {path}")
    try:
        shared = loads_line(data)
    except json.JSONDecodeError as e:
        raise ValueError(f"whose file is not JSON ({e}): {path}") from e
    if not isinstance(shared, dict):
        shared = {}
    ids = shared.get("ids")
    if (shared.get("shared_version") != SHARED_VERSION or type(shared.get("request")) is not dict
            or type(ids) is not list or not _only(ids, int) or min(ids, default=0) < 0
            or max(ids, default=0) > MAX_TOKEN_ID):
        raise ValueError(f"whose file is not a shared prefix of version {SHARED_VERSION}: {path}")
    return tuple(ids), shared["request"]


def without_prompt_ids(line: bytes, payload: bool = True) -> tuple[dict[str, Any], bytes] | None:
    """A format-1 line parsed with its prompt_ids array cut out (null in its place), and that array's text:
    most of a long session's line, parsed apart or not at all. payload=False: the request is cut out too.
    None when the cut cannot be trusted (no array right after the key, not JSON once cut, "prompt_ids" is
    not the null put there, or the key comes again after the array): then parse the whole line."""
    key = line.find(_PROMPT_KEY)
    open_ = line.find(b"[", key, key + 20) if key >= 0 else -1
    if open_ < 0 or line[key + len(_PROMPT_KEY):open_].strip():
        return None
    close = line.find(b"]", open_)
    if close < 0 or line.find(_PROMPT_KEY, close) >= 0:
        return None
    rest = line[:open_] + b"null" + line[close + 1:]
    try:
        data = loads_line(rest if payload else _without_request(rest))
    except json.JSONDecodeError:
        return None
    if not isinstance(data, dict) or "prompt_ids" not in data or data["prompt_ids"] is not None:
        return None
    return data, line[open_:close + 1]


def _without_request(line: bytes) -> bytes:
    """A format-1 line with its request value replaced by null, uncut when it is not where the writer puts
    it. Both keys are found as raw text, which a JSON string cannot hold unescaped; a nested "response" key
    found instead of the record's own leaves unbalanced braces, which the parse then refuses."""
    start, end = line.find(_REQUEST_KEY), line.rfind(_RESPONSE_KEY)
    if start < 0 or end < start:
        return line
    return line[:start] + _REQUEST_KEY + b"null," + line[end:]


def record_from_dict(data: dict[str, Any], stored: Any = None) -> CallRecord:
    """CallRecord.from_dict with a fast path for the usual case (id lists of plain ints, logprobs of floats)
    that converts no id one by one. `stored`: the prompt ids the line itself held, when the rest came
    from an earlier line (only they need checking: the rest was checked on its own line); a tuple of
    them is known to hold only integers."""
    prompt, output, logprobs = data.get("prompt_ids"), data.get("output_ids"), data.get("output_logprobs")
    stored = prompt if stored is None else stored
    if (_REQUIRED <= data.keys() and type(prompt) in (list, tuple) and type(output) is list
            and (type(stored) is tuple or type(stored) is list and _only(stored, int)) and _only(output, int)
            and (logprobs is None or type(logprobs) is list) and _only(logprobs or [], float)):
        kwargs = {k: data[k] for k in _FIELDS if k in data}
        kwargs.update(prompt_ids=tuple(prompt), output_ids=tuple(output), output_logprobs=tuple(logprobs or ()),
                      flags=tuple(data.get("flags") or ()))
        return CallRecord(**kwargs)
    if type(prompt) is tuple:
        data = {**data, "prompt_ids": list(prompt)}
    return CallRecord.from_dict(data)


def _only(values: list[Any] | tuple[Any, ...], kind: type) -> bool:
    return not values or set(map(type, values)) == {kind}


def read_capture(path: str | os.PathLike) -> Iterator[CallRecord]:
    """Full CallRecords of one capture file (either format), prompt_ids and request rebuilt exactly."""
    decoder = CaptureDecoder(path)
    for _, lineno, data, stored in decoder.lines():
        try:
            record = decoder.decode(data, stored=stored)
        except (ValueError, TypeError, KeyError) as e:
            raise ValueError(f"{path}:{lineno}: {e}") from e
        yield record


def read_capture_dicts(path: str | os.PathLike) -> Iterator[dict[str, Any]]:
    """The records of one capture file as format-1 JSON objects (lists, not tuples): for code that reads
    capture lines as plain dicts."""
    for record in read_capture(path):
        yield json.loads(record.to_json())
