"""mitmproxy responses in a provider's own shape (errors, JSON bodies)."""
from __future__ import annotations

import json
from typing import Any

import orjson
from mitmproxy import http

from polar_mitm.conversation import ProviderError
from polar_mitm.providers import CODECS


def family_api(family: str) -> str:
    return {"anthropic": "anthropic", "gemini": "gemini"}.get(family, "openai_chat")


def json_response(status: int, body: Any) -> http.Response:
    try:
        data = orjson.dumps(body)
    except TypeError:  # a lone surrogate, an int past 64 bits: the stdlib escapes them
        data = json.dumps(body).encode()
    return http.Response.make(status, data, {"content-type": "application/json"})


def error_response(api: str, status: int, message: str, kind: str | None = None) -> http.Response:
    err = ProviderError(status, message, kind or _default_kind(status))
    return json_response(status, CODECS[api].render_error(err))


def _default_kind(status: int) -> str:
    return {
        401: "authentication_error", 403: "permission_error", 404: "not_found_error", 407: "authentication_error",
        413: "request_too_large", 429: "rate_limit_error", 503: "overloaded_error",
    }.get(status, "invalid_request_error" if status < 500 else "api_error")
