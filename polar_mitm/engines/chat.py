"""Engine-side rendering (`polar proxy --render engine`, issue 45 item 4): for a model whose chat template or
tool-call format the proxy does not render or parse itself, the engine does both.

The proxy sends the conversation to the engine's OpenAI chat endpoint (`/v1/chat/completions`) asking for token
ids (`return_token_ids`, vLLM >= 0.10.2) and the sampled tokens' logprobs, answers the harness from the engine's
parsed message (content, reasoning, tool calls), and records the same CallRecord as ever: the prompt ids the
engine rendered, the sampled ids and their logprobs, `prefix_source` `rendered:engine`. No history is
substituted: each call is the engine's own rendering of the whole conversation, so a chain merges by token prefix
only where the template re-renders earlier turns as they were sampled (polar_traj shows where it breaks).
"""
from __future__ import annotations

import json
from typing import Any

from polar_mitm.conversation import (ContentDelta, Conversation, ReasoningDelta, ReplyEvent, Sampling, ToolCall,
                                     ToolCallDone)
from polar_mitm.engines.api import EngineError, EngineOutput, copy_sampling, finish_of
from polar_mitm.tokens.prompt import to_template_messages, to_template_tools
from polar_mitm.tokens.reply_parser import ParsedReply

CHAT_PATH = "/v1/chat/completions"
ENGINE_SOURCE = "rendered:engine"  # the record's prefix_source
RENDERS = ("proxy", "engine")  # polar_render: who renders the prompt and parses the reply
NO_PROMPT_IDS = ("the engine's chat answer has no prompt_token_ids (vLLM >= 0.10.2 with return_token_ids is "
                 "required for --render engine)")


def chat_request(conv: Conversation, sampling: Sampling, max_new_tokens: int, stream: bool,
                 model: str | None = None) -> tuple[str, dict[str, Any]]:
    """(path, JSON body) asking the engine to render `conv` with its template, sample, and return the prompt's and
    the reply's token ids with the sampled tokens' logprobs."""
    body: dict[str, Any] = {"messages": to_template_messages(conv.messages, text_arguments=True),
                            "max_tokens": max_new_tokens,
                            "logprobs": True, "return_token_ids": True, "stream": stream}
    tools = to_template_tools(conv.tools)
    if tools:
        body["tools"] = tools
    if model:
        body["model"] = model
    copy_sampling(sampling, body)
    return CHAT_PATH, body


class EngineReply:
    """The engine's parsed reply, in the shape of polar_mitm/tokens/reply_parser.py's parsers: `feed` takes a
    whole message or one streamed delta and returns content and reasoning as they come; each tool call is complete
    only at the end (its arguments may arrive in pieces), so `finish` emits them."""

    def __init__(self, call_id_prefix: str) -> None:
        self.prefix = call_id_prefix
        self._content: list[str] = []
        self._reasoning: list[str] = []
        self._calls: dict[int, dict[str, str]] = {}
        self._done: tuple[ToolCall, ...] | None = None

    def feed(self, message: dict[str, Any]) -> list[ReplyEvent]:
        events: list[ReplyEvent] = []
        reasoning = message.get("reasoning_content") or message.get("reasoning")
        if isinstance(reasoning, str) and reasoning:
            self._reasoning.append(reasoning)
            events.append(ReasoningDelta(reasoning))
        content = message.get("content")
        if isinstance(content, str) and content:
            self._content.append(content)
            events.append(ContentDelta(content))
        for i, call in enumerate(message.get("tool_calls") or []):
            slot = self._calls.setdefault(int(call.get("index", i)), {"id": "", "name": "", "arguments": ""})
            fn = call.get("function") or {}
            slot["id"] = call.get("id") or slot["id"]
            slot["name"] += fn.get("name") or ""
            arguments = fn.get("arguments")
            slot["arguments"] += arguments if isinstance(arguments, str) else json.dumps(arguments or {})
        return events

    def finish(self) -> list[ReplyEvent]:
        if self._done is not None:
            return []
        self._done = tuple(ToolCall(slot["id"] or f"{self.prefix}{i}", slot["name"], slot["arguments"] or "{}")
                           for i, slot in sorted(self._calls.items()))
        return [ToolCallDone(i, call) for i, call in enumerate(self._done)]

    def result(self) -> ParsedReply:
        flags = tuple(f"tool_arguments_not_json:{c.name}" for c in self._done or () if not _is_object(c.arguments))
        return ParsedReply("".join(self._content), "".join(self._reasoning) or None, self._done or (), flags)


def apply_chat(data: dict[str, Any], out: EngineOutput, reply: EngineReply) -> tuple[list[int] | None,
                                                                                     list[ReplyEvent]]:
    """Fold one chat answer (whole, or one streamed chunk) into `out` and `reply`: (the prompt's ids when this
    answer carries them, the reply's events)."""
    try:
        return _apply_chat(data, out, reply)
    except (AttributeError, TypeError, KeyError, ValueError) as e:  # a shape no chat API answers with
        raise EngineError(f"malformed chat answer from the engine ({type(e).__name__}: {e})") from e


def _apply_chat(data: dict[str, Any], out: EngineOutput, reply: EngineReply) -> tuple[list[int] | None,
                                                                                      list[ReplyEvent]]:
    if "error" in data:
        err = data["error"]
        raise EngineError(str(err.get("message") if isinstance(err, dict) else err))
    prompt = data.get("prompt_token_ids")
    events: list[ReplyEvent] = []
    for choice in data.get("choices") or []:
        prompt = prompt or choice.get("prompt_token_ids")
        message = choice.get("message") or choice.get("delta") or {}
        ids = choice.get("token_ids")
        if ids is None and (message.get("content") or "message" in choice):
            raise EngineError("the engine's chat answer has no token ids (vLLM >= 0.10.2 with return_token_ids "
                              "is required for --render engine)")
        lps = [float(e["logprob"]) for e in ((choice.get("logprobs") or {}).get("content") or [])]
        out.output_ids.extend(ids or [])
        out.logprobs.extend(lps)
        out.finish_reason = finish_of(choice.get("finish_reason")) or out.finish_reason
        events += reply.feed(message)
    return (list(prompt) if prompt is not None else None), events


def _is_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except json.JSONDecodeError:
        return False
