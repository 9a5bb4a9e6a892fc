"""Minimal raw requests of the four provider APIs, sent with httpx either way in (HTTPS_PROXY to the real
hostname, or the base-URL listener), and the checks that an answer has the provider's own error shape."""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import httpx

APIS = ("openai_chat", "openai_responses", "anthropic", "gemini")
HOSTS = {"openai_chat": "api.openai.com", "openai_responses": "api.openai.com", "anthropic": "api.anthropic.com",
         "gemini": "generativelanguage.googleapis.com"}


@dataclass(frozen=True)
class ProviderRequest:
    api: str
    path: str
    headers: dict[str, str]
    body: dict[str, Any]


def provider_request(api: str, text: str, stream: bool, key: str, max_tokens: int = 6) -> ProviderRequest:
    if api == "openai_chat":
        return ProviderRequest(api, "/v1/chat/completions", {"authorization": f"Bearer {key}"},
                               {"model": "tiny", "max_tokens": max_tokens, "stream": stream,
                                "messages": [{"role": "user", "content": text}]})
    if api == "openai_responses":
        return ProviderRequest(api, "/v1/responses", {"authorization": f"Bearer {key}"},
                               {"model": "tiny", "max_output_tokens": max_tokens, "stream": stream, "input": text})
    if api == "anthropic":
        return ProviderRequest(api, "/v1/messages", {"x-api-key": key, "anthropic-version": "2023-06-01"},
                               {"model": "tiny", "max_tokens": max_tokens, "stream": stream,
                                "messages": [{"role": "user", "content": text}]})
    method = "streamGenerateContent?alt=sse" if stream else "generateContent"
    return ProviderRequest(api, f"/v1beta/models/tiny:{method}", {"x-goog-api-key": key},
                           {"contents": [{"role": "user", "parts": [{"text": text}]}],
                            "generationConfig": {"maxOutputTokens": max_tokens}})


def send(proxy, req: ProviderRequest, via: str, raw_body: bytes | None = None, session: str = "sess",
         timeout: float = 60) -> httpx.Response:
    content = raw_body if raw_body is not None else json.dumps(req.body).encode()
    headers = {**req.headers, "content-type": "application/json"}
    if via == "base_url":
        return httpx.post(proxy.base_url + req.path, content=content, headers=headers, timeout=timeout)
    with httpx.Client(proxy=proxy.proxy_url(session, "tok"), verify=str(proxy.ca_cert), timeout=timeout) as client:
        return client.post(f"https://{HOSTS[req.api]}{req.path}", content=content, headers=headers)


def is_provider_error(api: str, body: Any) -> bool:
    """The error object each provider's SDK parses."""
    if not isinstance(body, dict):
        return False
    if api == "anthropic":
        return body.get("type") == "error" and "message" in body.get("error", {})
    if api == "gemini":
        return isinstance(body.get("error"), dict) and "status" in body["error"]
    return isinstance(body.get("error"), dict) and "message" in body["error"]


def stream_error(api: str, text: str) -> dict | None:
    """The error event of a provider SSE stream, if it has one."""
    for line in text.splitlines():
        if not line.startswith("data:"):
            continue
        try:
            data = json.loads(line[5:])
        except ValueError:
            continue
        if api == "openai_responses" and isinstance(data, dict) and data.get("type") in ("error", "response.failed"):
            return data
        if is_provider_error(api, data):
            return data
    return None
