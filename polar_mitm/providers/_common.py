"""Helpers the provider codecs share: request validation, reasoning artefacts, SSE framing.

Every validation helper raises `ProviderError(400, …)` naming the offending field, so a
malformed request is answered in the provider's own error shape by the caller.
"""
from __future__ import annotations

import base64
import binascii
import json
import time
from typing import Any, Iterable

from polar_mitm.conversation import Completion, Message, ProviderError, ToolCall

SYSTEM_SEPARATOR = "\n\n"  # between several system/developer prompts
PART_SEPARATOR = "\n"  # between text parts of one message
_ARTEFACT_TAG = "polar"


def bad(message: str) -> ProviderError:
    return ProviderError(400, message)


# ---------------------------------------------------------------- validation


def expect_dict(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise bad(f"{where} must be an object")
    return value


def expect_list(value: Any, where: str) -> list[Any]:
    if not isinstance(value, list):
        raise bad(f"{where} must be an array")
    return value


def req_str(d: dict[str, Any], key: str, where: str) -> str:
    value = d.get(key)
    if not isinstance(value, str) or not value:
        raise bad(f"{where}.{key} is required and must be a non-empty string")
    return value


def opt_str(d: dict[str, Any], key: str, where: str) -> str | None:
    value = d.get(key)
    if value is not None and not isinstance(value, str):
        raise bad(f"{where}.{key} must be a string")
    return value


def opt_int(d: dict[str, Any], key: str, where: str) -> int | None:
    value = d.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad(f"{where}.{key} must be an integer")
    return value


def opt_float(d: dict[str, Any], key: str, where: str) -> float | None:
    value = d.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise bad(f"{where}.{key} must be a number")
    return float(value)


def opt_bool(d: dict[str, Any], key: str, where: str) -> bool:
    value = d.get(key, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise bad(f"{where}.{key} must be a boolean")
    return value


def opt_stop(d: dict[str, Any], key: str, where: str) -> tuple[str, ...]:
    value = d.get(key)
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list) and all(isinstance(s, str) for s in value):
        return tuple(value)
    raise bad(f"{where}.{key} must be a string or an array of strings")


def first_int(d: dict[str, Any], keys: Iterable[str], where: str) -> int | None:
    """The first of several equivalent integer fields that is set (e.g. max_completion_tokens, max_tokens)."""
    for key in keys:
        value = opt_int(d, key, where)
        if value is not None:
            return value
    return None


# ---------------------------------------------------------------- text parts


def media_placeholder(kind: str) -> str:
    """What a non-text part (image, audio, file, document) becomes: Polar serves text-only models."""
    return f"[{kind} omitted: this model reads text only]"


def join_text(
    content: Any,
    where: str,
    text_types: frozenset[str],
    media_types: frozenset[str] = frozenset(),
    sep: str = PART_SEPARATOR,
) -> str:
    """Text of a `content` that is a string, null, or a list of typed parts.

    Parts whose type is in `text_types` contribute their `text` (or `refusal`); parts in
    `media_types` become a placeholder; any other part is a 400.
    """
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    texts: list[str] = []
    for i, part in enumerate(expect_list(content, where)):
        part = expect_dict(part, f"{where}[{i}]")
        kind = part.get("type")
        if kind in text_types:
            text = part.get("text", part.get("refusal", ""))
            if not isinstance(text, str):
                raise bad(f"{where}[{i}].text must be a string")
            texts.append(text)
        elif kind in media_types:
            texts.append(media_placeholder(str(kind)))
        else:
            raise bad(f"{where}[{i}]: content part type {kind!r} is not supported")
    return sep.join(texts)


# ---------------------------------------------------------------- tool calls


def dump_arguments(args: Any) -> str:
    """The one canonical JSON text of tool-call arguments used by every codec and the reply parser."""
    return json.dumps(args, ensure_ascii=False)


def canonical_arguments(value: Any, where: str) -> str:
    """Arguments as sent by a harness (JSON text or an object) in canonical JSON text.

    Text that is not a JSON object is kept byte-for-byte, so nothing the model wrote is lost.
    """
    if value is None:
        return "{}"
    if isinstance(value, dict):
        return dump_arguments(value)
    if not isinstance(value, str):
        raise bad(f"{where} must be a JSON string or an object")
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError:
        return value
    return dump_arguments(parsed) if isinstance(parsed, dict) else value


class Transcript:
    """Collects system prompts (hoisted into one leading system message) and turns in order."""

    def __init__(self) -> None:
        self._system: list[str] = []
        self._messages: list[Message] = []
        self._names: dict[str, str] = {}

    def add_system(self, text: str) -> None:
        if text:
            self._system.append(text)

    def add(self, message: Message) -> None:
        for call in message.tool_calls:
            self._names[call.id] = call.name
        self._messages.append(message)

    def name_for(self, call_id: str | None) -> str | None:
        return self._names.get(call_id) if call_id else None

    def knows(self, call_id: str | None) -> bool:
        """Whether a tool call with this id was seen so far."""
        return call_id in self._names

    def build(self) -> tuple[Message, ...]:
        head = (Message("system", SYSTEM_SEPARATOR.join(self._system)),) if self._system else ()
        return head + tuple(self._messages)


def assistant(content: list[str], reasoning: list[str], calls: list[ToolCall]) -> Message:
    """One assistant Message from the pieces of a turn; reasoning is None when there was none."""
    return Message(
        "assistant",
        PART_SEPARATOR.join(c for c in content if c),
        PART_SEPARATOR.join(r for r in reasoning if r) or None,
        tuple(calls),
    )


# ---------------------------------------------------------------- reasoning artefacts


def encode_reasoning(text: str) -> str:
    """An opaque artefact (signature, encrypted_content, thoughtSignature) holding the reasoning text.

    Standard base64 of `{"polar": 1, "reasoning": text}`; harnesses re-send it unchanged.
    """
    raw = json.dumps({_ARTEFACT_TAG: 1, "reasoning": text}, ensure_ascii=False, separators=(",", ":"))
    return base64.b64encode(raw.encode("utf-8")).decode("ascii")


def decode_reasoning(artefact: Any) -> str | None:
    """The reasoning text inside an artefact Polar made; None for anything else (e.g. a real provider's)."""
    if not isinstance(artefact, str) or not artefact:
        return None
    try:
        value = json.loads(base64.b64decode(artefact, validate=True).decode("utf-8"))
    except (binascii.Error, ValueError, UnicodeDecodeError):
        return None
    if isinstance(value, dict) and value.get(_ARTEFACT_TAG) == 1 and isinstance(value.get("reasoning"), str):
        return value["reasoning"]
    return None


# ---------------------------------------------------------------- rendering


def effective_finish(completion: Completion) -> str:
    """`length` wins; a turn with tool calls finishes with `tool_calls`; anything else is `stop`."""
    if completion.finish_reason == "length":
        return "length"
    return "tool_calls" if completion.tool_calls else "stop"


def sse(payload: dict[str, Any], event: str | None = None) -> bytes:
    data = json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {data}\n\n".encode("utf-8")


def now() -> int:
    return int(time.time())
