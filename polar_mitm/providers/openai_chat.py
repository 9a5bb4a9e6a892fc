"""OpenAI Chat Completions codec (`POST /v1/chat/completions`; qwen, opencode, pi).

Request: system/developer messages are hoisted into one leading system message; assistant
`reasoning_content` (or `reasoning`) is the reasoning; `tool` (and legacy `function`) messages are
tool results; only `function` tools are kept. Image/audio/file parts become a text placeholder.
Response: `reasoning_content` beside `content`; streams end with a finish chunk, a usage chunk
when `stream_options.include_usage` is set, then `data: [DONE]`.
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
    Transcript,
    bad,
    canonical_arguments,
    effective_finish,
    expect_dict,
    expect_list,
    first_int,
    join_text,
    now,
    opt_bool,
    opt_float,
    opt_int,
    opt_stop,
    opt_str,
    req_str,
    sse,
)

API = "openai_chat"
_TEXT = frozenset({"text", "input_text", "output_text", "refusal"})
_MEDIA = frozenset({"image_url", "input_audio", "file", "input_image", "input_file"})


# ---------------------------------------------------------------- request


def parse_request(body: dict[str, Any], path: str = "/v1/chat/completions") -> Conversation:
    body = expect_dict(body, "request body")
    model = req_str(body, "model", "request")
    messages = expect_list(body.get("messages"), "messages")
    if not messages:
        raise bad("messages must not be empty")
    if body.get("n") not in (None, 1):
        raise bad("n > 1 is not supported")
    transcript = Transcript()
    for i, message in enumerate(messages):
        _add_message(transcript, expect_dict(message, f"messages[{i}]"), f"messages[{i}]")
    return Conversation(
        api=API,
        model=model,
        messages=transcript.build(),
        tools=parse_tools(body.get("tools")),
        sampling=_sampling(body),
        stream=opt_bool(body, "stream", "request"),
    )


def encoder_options(body: dict[str, Any]) -> dict[str, Any]:
    """Extra StreamEncoder keyword arguments this request asks for."""
    options = body.get("stream_options")
    return {"include_usage": isinstance(options, dict) and options.get("include_usage") is True}


def _text(content: Any, where: str) -> str:
    return join_text(content, where, _TEXT, _MEDIA)


def _add_message(transcript: Transcript, m: dict[str, Any], where: str) -> None:
    role = req_str(m, "role", where)
    if role in ("system", "developer"):
        transcript.add_system(_text(m.get("content"), f"{where}.content"))
    elif role == "user":
        transcript.add(Message("user", _text(m.get("content"), f"{where}.content")))
    elif role == "assistant":
        transcript.add(_assistant(m, where))
    elif role in ("tool", "function"):
        call_id = opt_str(m, "tool_call_id", where)
        name = opt_str(m, "name", where) or transcript.name_for(call_id)
        content = _text(m.get("content"), f"{where}.content")
        transcript.add(Message("tool", content, tool_call_id=call_id, name=name))
    else:
        raise bad(f"{where}.role {role!r} is not supported")


def _assistant(m: dict[str, Any], where: str) -> Message:
    reasoning = opt_str(m, "reasoning_content", where)
    if reasoning is None:
        reasoning = opt_str(m, "reasoning", where)
    raw_calls = expect_list(m.get("tool_calls") or [], f"{where}.tool_calls")
    calls = tuple(_tool_call(expect_dict(c, f"{where}.tool_calls[{j}]"), f"{where}.tool_calls[{j}]")
                  for j, c in enumerate(raw_calls))
    return Message("assistant", _text(m.get("content"), f"{where}.content"), reasoning or None, calls)


def _tool_call(call: dict[str, Any], where: str) -> ToolCall:
    function = expect_dict(call.get("function"), f"{where}.function")
    arguments = canonical_arguments(function.get("arguments"), f"{where}.function.arguments")
    return ToolCall(req_str(call, "id", where), req_str(function, "name", f"{where}.function"), arguments)


def parse_tools(tools: Any) -> tuple[Tool, ...]:
    """`function` tools; any other tool type is not offered to the model (dropped)."""
    out: list[Tool] = []
    for i, tool in enumerate(expect_list(tools or [], "tools")):
        tool = expect_dict(tool, f"tools[{i}]")
        if tool.get("type", "function") != "function":
            continue
        fn = expect_dict(tool.get("function"), f"tools[{i}].function")
        params = expect_dict(fn.get("parameters") or {}, f"tools[{i}].function.parameters")
        description = opt_str(fn, "description", f"tools[{i}].function") or ""
        out.append(Tool(req_str(fn, "name", f"tools[{i}].function"), description, params))
    return tuple(out)


def _sampling(body: dict[str, Any]) -> Sampling:
    return Sampling(
        max_tokens=first_int(body, ("max_completion_tokens", "max_tokens"), "request"),
        temperature=opt_float(body, "temperature", "request"),
        top_p=opt_float(body, "top_p", "request"),
        top_k=opt_int(body, "top_k", "request"),
        stop=opt_stop(body, "stop", "request"),
        seed=opt_int(body, "seed", "request"),
    )


# ---------------------------------------------------------------- response


def _usage(c: Completion) -> dict[str, int]:
    return {
        "prompt_tokens": c.prompt_tokens,
        "completion_tokens": c.completion_tokens,
        "total_tokens": c.prompt_tokens + c.completion_tokens,
    }


def _tool_call_json(call: ToolCall) -> dict[str, Any]:
    return {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}


def render_response(completion: Completion, **_options: Any) -> dict[str, Any]:
    c = completion
    message: dict[str, Any] = {"role": "assistant", "content": c.content if c.content or not c.tool_calls else None}
    if c.reasoning:
        message["reasoning_content"] = c.reasoning
    if c.tool_calls:
        message["tool_calls"] = [_tool_call_json(call) for call in c.tool_calls]
    return {
        "id": c.id,
        "object": "chat.completion",
        "created": now(),
        "model": c.model,
        "choices": [{"index": 0, "message": message, "finish_reason": effective_finish(c), "logprobs": None}],
        "usage": _usage(c),
    }


class StreamEncoder:
    """`chat.completion.chunk` SSE: role first, reasoning/content deltas, tool calls, finish, usage, [DONE]."""

    def __init__(self, completion_id: str, model: str, *, include_usage: bool = False, prompt_tokens: int = 0) -> None:
        self._id = completion_id
        self._model = model
        self._created = now()
        self._include_usage = include_usage

    def _chunk(self, delta: dict[str, Any], finish_reason: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        return sse(self._envelope([choice]))

    def _envelope(self, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {"id": self._id, "object": "chat.completion.chunk", "created": self._created,
                "model": self._model, "choices": choices}

    def start(self) -> bytes:
        return self._chunk({"role": "assistant", "content": ""})

    def feed(self, event: ReplyEvent) -> bytes:
        if isinstance(event, ReasoningDelta):
            return self._chunk({"reasoning_content": event.text}) if event.text else b""
        if isinstance(event, ContentDelta):
            return self._chunk({"content": event.text}) if event.text else b""
        if isinstance(event, ToolCallDone):
            call = event.call
            head = {"index": event.index, "id": call.id, "type": "function",
                    "function": {"name": call.name, "arguments": ""}}
            args = {"index": event.index, "function": {"arguments": call.arguments}}
            return self._chunk({"tool_calls": [head]}) + self._chunk({"tool_calls": [args]})
        raise TypeError(f"unknown reply event {event!r}")

    def finish(self, completion: Completion) -> bytes:
        out = self._chunk({}, effective_finish(completion))
        if self._include_usage:
            out += sse({**self._envelope([]), "usage": _usage(completion)})
        return out + b"data: [DONE]\n\n"

    def fail(self, err: ProviderError) -> bytes:
        """An error after the stream began: an `error` data line, as OpenAI sends, then [DONE]."""
        return sse(render_error(err)) + b"data: [DONE]\n\n"


# ---------------------------------------------------------------- errors and side endpoints


# ProviderError.kind values that name a class of error; any other kind (e.g. "context_length_exceeded")
# is a specific code and goes into `code`.
GENERIC_KINDS = frozenset({"invalid_request_error", "authentication_error", "permission_error", "not_found_error",
                           "request_too_large", "rate_limit_error", "overloaded_error", "api_error", "server_error"})


def error_code(err: ProviderError) -> str | None:
    return None if err.kind in GENERIC_KINDS else err.kind


def _error_type(status: int) -> str:
    if status in (401, 407):
        return "authentication_error"
    if status == 403:
        return "permission_error"
    if status == 429:
        return "rate_limit_error"
    return "server_error" if status >= 500 else "invalid_request_error"


def render_error(err: ProviderError) -> dict[str, Any]:
    """`{"error": {message, type, param, code}}`, shared by Chat Completions and Responses; the type
    follows the HTTP status, a specific `kind` (e.g. context_length_exceeded) becomes the code."""
    return {"error": {"message": err.message, "type": _error_type(err.status), "param": None, "code": error_code(err)}}


def render_models(model_ids: Sequence[str]) -> dict[str, Any]:
    """`GET /v1/models`."""
    created = now()
    data = [{"id": m, "object": "model", "created": created, "owned_by": "polar"} for m in model_ids]
    return {"object": "list", "data": data}

