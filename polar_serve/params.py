"""Checked reads of JSON request fields, shared by the SGLang and vLLM request parsers. Every failure is a
BadRequest (HTTP 400) that names the field."""
from __future__ import annotations

from typing import Any


class BadRequest(ValueError):
    def __init__(self, message: str, kind: str = "invalid_request_error", status: int = 400) -> None:
        super().__init__(message)
        self.message = message
        self.kind = kind
        self.status = status


def as_object(body: Any, what: str = "request body") -> dict[str, Any]:
    if not isinstance(body, dict):
        raise BadRequest(f"{what} must be a JSON object")
    return body


def get_int(d: dict[str, Any], key: str, default: int | None) -> int | None:
    value = d.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequest(f"`{key}` must be an integer, got {value!r}")
    return value


def get_float(d: dict[str, Any], key: str, default: float) -> float:
    value = d.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BadRequest(f"`{key}` must be a number, got {value!r}")
    return float(value)


def get_bool(d: dict[str, Any], key: str, default: bool) -> bool:
    value = d.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise BadRequest(f"`{key}` must be true or false, got {value!r}")
    return value


def get_strings(d: dict[str, Any], key: str) -> tuple[str, ...]:
    value = d.get(key)
    if value is None:
        return ()
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(s, str) and s for s in items):
        raise BadRequest(f"`{key}` must be a non-empty string or a list of them, got {value!r}")
    return tuple(items)


def get_ids(d: dict[str, Any], key: str) -> tuple[int, ...]:
    value = d.get(key)
    if value is None:
        return ()
    if not is_id_list(value):
        raise BadRequest(f"`{key}` must be a list of token ids, got {value!r}")
    return tuple(value)


def is_id_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in value)


def require_neutral(d: dict[str, Any], neutral: dict[str, Any]) -> None:
    """Fields we accept only at their no-op value: anything else would silently change the sampling."""
    for key, value in neutral.items():
        if d.get(key) not in (None, value):
            raise BadRequest(f"`{key}`={d[key]!r} is not supported by the reference server (only {value!r})")


def check_prompt(prompt_ids: list[int], max_new_tokens: int, vocab_size: int, max_context: int) -> None:
    if not prompt_ids:
        raise BadRequest("the prompt is empty")
    bad = [t for t in prompt_ids if not 0 <= t < vocab_size]
    if bad:
        raise BadRequest(f"prompt token ids out of vocabulary range [0, {vocab_size}): {bad[:5]}")
    if len(prompt_ids) + max_new_tokens > max_context:
        raise BadRequest(
            f"this model's maximum context length is {max_context} tokens, but the request needs "
            f"{len(prompt_ids)} prompt + {max_new_tokens} new tokens; shorten the prompt or lower max tokens",
            kind="context_length_exceeded")
