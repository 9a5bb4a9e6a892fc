"""Anthropic Messages codec (`POST /v1/messages?beta=true`, `/v1/messages/count_tokens`; claude, opencode, pi).

Request: `system` (string or text blocks) is the leading system message; in a user message,
`tool_result` blocks become tool messages in place (text before and after them stays user text,
in order); assistant `thinking` blocks are reasoning, read from the `signature` Polar made (see
`_common.encode_reasoning`) or else from the `thinking` text, and `redacted_thinking` counts only
when its `data` is Polar's; `tool_use` blocks are tool calls. `cache_control` is ignored. Tools
with a server/computer `type` are dropped; image/document blocks become a text placeholder.
Response: `thinking` (with signature), `text`, `tool_use` blocks; the SSE sequence is
message_start, ping, content_block_start/delta/stop per block, message_delta, message_stop.
"""
from __future__ import annotations

from typing import Any, Sequence

from polar_mitm.conversation import (
    Completion,
    ContentDelta,
    Conversation,
    Message,
    ProviderError,
    ReasoningDelta,
    ReplyEvent,
    Sampling,
    Tool,
    ToolCall,
    ToolCallDone,
)
from polar_mitm.providers._common import (
    SYSTEM_SEPARATOR,
    Transcript,
    assistant,
    bad,
    canonical_arguments,
    decode_reasoning,
    dump_arguments,
    effective_finish,
    encode_reasoning,
    expect_dict,
    expect_list,
    join_text,
    media_placeholder,
    opt_bool,
    opt_float,
    opt_int,
    opt_stop,
    opt_str,
    req_str,
    sse,
)

API = "anthropic"
_TEXT = frozenset({"text"})
_MEDIA = frozenset({"image", "document"})
_STOP = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


# ---------------------------------------------------------------- request


def parse_request(body: dict[str, Any], path: str = "/v1/messages") -> Conversation:
    body = expect_dict(body, "request body")
    model = req_str(body, "model", "request")
    messages = expect_list(body.get("messages"), "messages")
    if not messages:
        raise bad("messages must not be empty")
    transcript = Transcript()
    transcript.add_system(join_text(body.get("system"), "system", _TEXT, sep=SYSTEM_SEPARATOR))
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        message = expect_dict(message, where)
        role = req_str(message, "role", where)
        content = message.get("content")
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else expect_list(
            content, f"{where}.content")
        if role == "user":
            _add_user(transcript, blocks, where)
        elif role == "assistant":
            transcript.add(_assistant(blocks, where))
        elif role == "system":
            # Claude Code's mid-conversation system turn (beta mid-conversation-system): kept in place.
            transcript.add(Message("system", join_text(content, f"{where}.content", _TEXT)))
        else:
            raise bad(f"{where}.role {role!r} is not supported")
    return Conversation(
        api=API,
        model=model,
        messages=transcript.build(),
        tools=_tools(body.get("tools")),
        sampling=Sampling(
            max_tokens=opt_int(body, "max_tokens", "request"),
            temperature=opt_float(body, "temperature", "request"),
            top_p=opt_float(body, "top_p", "request"),
            top_k=opt_int(body, "top_k", "request"),
            stop=opt_stop(body, "stop_sequences", "request"),
        ),
        stream=opt_bool(body, "stream", "request"),
    )


def encoder_options(body: dict[str, Any]) -> dict[str, Any]:
    """Extra StreamEncoder keyword arguments this request asks for (none for Anthropic)."""
    return {}


def _add_user(transcript: Transcript, blocks: list[Any], where: str) -> None:
    texts: list[str] = []
    added = False
    for j, block in enumerate(blocks):
        at = f"{where}.content[{j}]"
        block = expect_dict(block, at)
        kind = block.get("type")
        if kind == "text":
            texts.append(_req_text(block, at))
        elif kind in _MEDIA:
            texts.append(media_placeholder(kind))
        elif kind == "tool_result":
            if texts:
                transcript.add(Message("user", "\n".join(texts)))
                texts = []
            call_id = req_str(block, "tool_use_id", at)
            output = join_text(block.get("content"), f"{at}.content", _TEXT, _MEDIA)
            transcript.add(Message("tool", output, tool_call_id=call_id, name=transcript.name_for(call_id)))
            added = True
        else:
            raise bad(f"{at}: block type {kind!r} is not supported in a user message")
    if texts or not added:
        transcript.add(Message("user", "\n".join(texts)))


def _req_text(block: dict[str, Any], where: str) -> str:
    text = block.get("text")
    if not isinstance(text, str):
        raise bad(f"{where}.text must be a string")
    return text


def _assistant(blocks: list[Any], where: str) -> Message:
    content: list[str] = []
    reasoning: list[str] = []
    calls: list[ToolCall] = []
    for j, block in enumerate(blocks):
        at = f"{where}.content[{j}]"
        block = expect_dict(block, at)
        kind = block.get("type")
        if kind == "text":
            content.append(_req_text(block, at))
        elif kind == "thinking":
            decoded = decode_reasoning(block.get("signature"))
            reasoning.append(decoded if decoded is not None else opt_str(block, "thinking", at) or "")
        elif kind == "redacted_thinking":
            reasoning.append(decode_reasoning(block.get("data")) or "")
        elif kind == "tool_use":
            arguments = canonical_arguments(expect_dict(block.get("input", {}), f"{at}.input"), f"{at}.input")
            calls.append(ToolCall(req_str(block, "id", at), req_str(block, "name", at), arguments))
        else:
            raise bad(f"{at}: block type {kind!r} is not supported in an assistant message")
    return assistant(content, reasoning, calls)


def _tools(tools: Any) -> tuple[Tool, ...]:
    """Client tools (no `type`, or `custom`); server and computer-use tools are dropped."""
    out: list[Tool] = []
    for i, tool in enumerate(expect_list(tools or [], "tools")):
        tool = expect_dict(tool, f"tools[{i}]")
        if tool.get("type") not in (None, "custom"):
            continue
        schema = expect_dict(tool.get("input_schema") or {}, f"tools[{i}].input_schema")
        description = opt_str(tool, "description", f"tools[{i}]") or ""
        out.append(Tool(req_str(tool, "name", f"tools[{i}]"), description, schema))
    return tuple(out)


# ---------------------------------------------------------------- response


def _usage(input_tokens: int, output_tokens: int) -> dict[str, int]:
    return {"input_tokens": input_tokens, "output_tokens": output_tokens,
            "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}


def _tool_use(call: ToolCall) -> dict[str, Any]:
    return {"type": "tool_use", "id": call.id, "name": call.name, "input": call.args()}


def render_response(completion: Completion, **_options: Any) -> dict[str, Any]:
    c = completion
    blocks: list[dict[str, Any]] = []
    if c.reasoning:
        blocks.append({"type": "thinking", "thinking": c.reasoning, "signature": encode_reasoning(c.reasoning)})
    if c.content:
        blocks.append({"type": "text", "text": c.content})
    blocks += [_tool_use(call) for call in c.tool_calls]
    return {
        "id": c.id,
        "type": "message",
        "role": "assistant",
        "model": c.model,
        "content": blocks or [{"type": "text", "text": ""}],
        "stop_reason": _STOP[effective_finish(c)],
        "stop_sequence": None,
        "usage": _usage(c.prompt_tokens, c.completion_tokens),
    }


class StreamEncoder:
    """Anthropic SSE with `event:` lines; one content block per reasoning run, text run, tool call."""

    def __init__(self, completion_id: str, model: str, *, prompt_tokens: int = 0) -> None:
        self._id = completion_id
        self._model = model
        self._prompt_tokens = prompt_tokens
        self._index = -1  # index of the newest block
        self._open: str | None = None  # "thinking" | "text": the block receiving deltas
        self._thinking = ""

    def _event(self, kind: str, **fields: Any) -> bytes:
        return sse({"type": kind, **fields}, event=kind)

    def start(self) -> bytes:
        message = {"id": self._id, "type": "message", "role": "assistant", "model": self._model, "content": [],
                   "stop_reason": None, "stop_sequence": None, "usage": _usage(self._prompt_tokens, 0)}
        return self._event("message_start", message=message) + self._event("ping")

    def _start_block(self, block: dict[str, Any]) -> bytes:
        self._index += 1
        return self._event("content_block_start", index=self._index, content_block=block)

    def _close(self) -> bytes:
        if self._open is None:
            return b""
        out = b""
        if self._open == "thinking":
            delta = {"type": "signature_delta", "signature": encode_reasoning(self._thinking)}
            out = self._event("content_block_delta", index=self._index, delta=delta)
        self._open, self._thinking = None, ""
        return out + self._event("content_block_stop", index=self._index)

    def _delta(self, kind: str, text: str) -> bytes:
        if not text:
            return b""
        out = b""
        if self._open != kind:
            block = {"type": "thinking", "thinking": "", "signature": ""} if kind == "thinking" else {
                "type": "text", "text": ""}
            out = self._close() + self._start_block(block)
            self._open = kind
        if kind == "thinking":
            self._thinking += text
            return out + self._event("content_block_delta", index=self._index,
                                     delta={"type": "thinking_delta", "thinking": text})
        return out + self._event("content_block_delta", index=self._index, delta={"type": "text_delta", "text": text})

    def feed(self, event: ReplyEvent) -> bytes:
        if isinstance(event, ReasoningDelta):
            return self._delta("thinking", event.text)
        if isinstance(event, ContentDelta):
            return self._delta("text", event.text)
        if isinstance(event, ToolCallDone):
            call = event.call
            out = self._close() + self._start_block({"type": "tool_use", "id": call.id, "name": call.name,
                                                     "input": {}})
            delta = {"type": "input_json_delta", "partial_json": dump_arguments(call.args())}
            return (out + self._event("content_block_delta", index=self._index, delta=delta)
                    + self._event("content_block_stop", index=self._index))
        raise TypeError(f"unknown reply event {event!r}")

    def finish(self, completion: Completion) -> bytes:
        out = self._close()
        if self._index < 0:  # nothing was said: one empty text block, as in render_response
            out += self._start_block({"type": "text", "text": ""}) + self._event("content_block_stop", index=0)
        delta = {"stop_reason": _STOP[effective_finish(completion)], "stop_sequence": None}
        usage = _usage(completion.prompt_tokens, completion.completion_tokens)
        return out + self._event("message_delta", delta=delta, usage=usage) + self._event("message_stop")

    def fail(self, err: ProviderError) -> bytes:
        """An error after the stream began: an `error` event, as Anthropic sends."""
        return sse(render_error(err), event="error")


# ---------------------------------------------------------------- errors and side endpoints

_ERROR_TYPES = {401: "authentication_error", 407: "authentication_error", 403: "permission_error",
                404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 529: "overloaded_error"}
_KNOWN_TYPES = frozenset({"invalid_request_error", "authentication_error", "permission_error", "not_found_error",
                          "request_too_large", "rate_limit_error", "api_error", "overloaded_error", "billing_error",
                          "timeout_error"})


def render_error(err: ProviderError) -> dict[str, Any]:
    """`{"type": "error", "error": {type, message}}`; a kind that is not an Anthropic error type
    (e.g. context_length_exceeded) gives way to the type of the HTTP status."""
    kind = err.kind
    if kind not in _KNOWN_TYPES or (kind == "invalid_request_error" and err.status != 400):
        kind = _ERROR_TYPES.get(err.status, "api_error" if err.status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": err.message}}


def render_models(model_ids: Sequence[str]) -> dict[str, Any]:
    """`GET /v1/models`."""
    created = "1970-01-01T00:00:00Z"
    data = [{"type": "model", "id": m, "display_name": m, "created_at": created} for m in model_ids]
    return {"data": data, "has_more": False, "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None}


def render_count_tokens(n: int) -> dict[str, int]:
    """`POST /v1/messages/count_tokens`."""
    return {"input_tokens": n}

