"""Which provider API a request path speaks, and which hosts count as LLM providers."""
from __future__ import annotations

import re
from dataclasses import dataclass

# Real provider hostnames the proxy intercepts (the harnesses' defaults, docs/design.md §7).
PROVIDER_HOSTS = {
    "api.openai.com": "openai",
    "api.anthropic.com": "anthropic",
    "generativelanguage.googleapis.com": "gemini",
    "dashscope.aliyuncs.com": "openai",
    "dashscope-intl.aliyuncs.com": "openai",
}


@dataclass(frozen=True)
class Route:
    kind: str  # "generate" | "count_tokens" | "models" | "model"
    api: str  # "openai_chat" | "openai_responses" | "anthropic" | "gemini"
    model: str | None = None  # Gemini carries the model in the path
    stream: bool = False  # Gemini carries the stream flag in the path


_GEMINI = re.compile(r"/models/(?P<model>[^/:]+):(?P<method>generateContent|streamGenerateContent|countTokens)$")
_MODEL_GET = re.compile(r"/models/(?P<model>[^/:]+)$")


def match_route(method: str, path: str, family: str) -> Route | None:
    """Map a request to a Route; None for anything that is not an LLM API call.

    `family` ("openai" | "anthropic" | "gemini") breaks ties for paths several providers share
    (`GET /v1/models`); it comes from the hostname or, in base-URL mode, from the headers.
    """
    path = path.split("?", 1)[0].rstrip("/")
    if method == "POST":
        if path.endswith("/chat/completions"):
            return Route("generate", "openai_chat")
        if path.endswith("/responses"):
            return Route("generate", "openai_responses")
        if path.endswith("/messages/count_tokens"):
            return Route("count_tokens", "anthropic")
        if path.endswith("/messages"):
            return Route("generate", "anthropic")
        m = _GEMINI.search(path)
        if m:
            kind = "count_tokens" if m["method"] == "countTokens" else "generate"
            return Route(kind, "gemini", m["model"], m["method"] == "streamGenerateContent")
        return None
    if method == "GET":
        api = {"anthropic": "anthropic", "gemini": "gemini"}.get(family, "openai_chat")
        if path.endswith("/models"):
            return Route("models", api)
        m = _MODEL_GET.search(path)
        if m:
            return Route("model", api, m["model"])
    return None


def family_of(host: str, headers: dict[str, str], path: str = "") -> str:
    """The provider family a request addresses: by hostname, else by its path, auth and version headers."""
    if host in PROVIDER_HOSTS:
        return PROVIDER_HOSTS[host]
    if path.startswith("/v1beta/"):
        return "gemini"
    if "anthropic-version" in headers or "x-api-key" in headers:
        return "anthropic"
    if "x-goog-api-key" in headers:
        return "gemini"
    return "openai"
