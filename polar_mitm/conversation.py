"""The neutral conversation every provider codec parses into and renders from."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Union


class ProviderError(Exception):
    """A request the proxy refuses; each codec renders it in its provider's own error shape."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON text of an object

    def args(self) -> dict[str, Any]:
        try:
            value = json.loads(self.arguments or "{}")
        except json.JSONDecodeError:
            return {}
        return value if isinstance(value, dict) else {}


@dataclass(frozen=True)
class Message:
    role: str  # "system" | "user" | "assistant" | "tool"
    content: str = ""
    reasoning: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None  # role "tool": which call this answers
    name: str | None = None  # role "tool": the tool's name (Gemini matches results by name)


@dataclass(frozen=True)
class Tool:
    name: str
    description: str = ""
    parameters: dict[str, Any] = field(default_factory=dict)  # JSON schema


@dataclass(frozen=True)
class Sampling:
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    stop: tuple[str, ...] = ()
    seed: int | None = None


@dataclass(frozen=True)
class Conversation:
    api: str  # "openai_chat" | "openai_responses" | "anthropic" | "gemini"
    model: str
    messages: tuple[Message, ...]
    tools: tuple[Tool, ...] = ()
    sampling: Sampling = Sampling()
    stream: bool = False


@dataclass(frozen=True)
class Completion:
    """One assistant turn as sampled, after the reply text was parsed."""

    id: str
    model: str
    content: str
    reasoning: str | None
    tool_calls: tuple[ToolCall, ...]
    finish_reason: str  # "stop" | "length" | "tool_calls"
    prompt_tokens: int
    completion_tokens: int


# Events a reply parser emits while tokens stream in; stream encoders turn them into SSE.
@dataclass(frozen=True)
class ReasoningDelta:
    text: str


@dataclass(frozen=True)
class ContentDelta:
    text: str


@dataclass(frozen=True)
class ToolCallDone:
    index: int
    call: ToolCall


ReplyEvent = Union[ReasoningDelta, ContentDelta, ToolCallDone]
