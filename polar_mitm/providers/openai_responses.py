"""OpenAI Responses codec (`POST /v1/responses`; codex, pi).

Request: `instructions` and system/developer input messages form one leading system message;
consecutive assistant-side items (`reasoning`, assistant `message`, `function_call`) form one
assistant turn; `function_call_output` items are tool results. A `reasoning` item's text is read
from the `encrypted_content` Polar made (see `_common.encode_reasoning`), else from its
`content` (reasoning_text), else from its `summary`. `custom_tool_call` items become calls with
arguments `{"input": …}`. Only `function` tools are offered to the model; other tool types are
dropped. `previous_response_id` is refused (Polar keeps no server state). Image/file/audio parts
become a text placeholder.
Response and SSE: see `_responses_out` (re-exported here).
"""
from __future__ import annotations

from typing import Any

from polar_mitm.conversation import Conversation, Message, Sampling, Tool, ToolCall
from polar_mitm.providers._common import (
    Transcript,
    assistant,
    bad,
    canonical_arguments,
    decode_reasoning,
    dump_arguments,
    expect_dict,
    expect_list,
    join_text,
    opt_bool,
    opt_float,
    opt_int,
    opt_str,
    req_str,
)
from polar_mitm.providers._responses_out import StreamEncoder, render_response
from polar_mitm.providers.openai_chat import render_error, render_models

API = "openai_responses"
_TEXT = frozenset({"input_text", "output_text", "text", "refusal"})
_MEDIA = frozenset({"input_image", "input_file", "input_audio"})
_REASONING_TEXT = frozenset({"reasoning_text", "summary_text", "text"})

__all__ = ["API", "StreamEncoder", "encoder_options", "parse_request", "render_error", "render_models",
           "render_response"]


def parse_request(body: dict[str, Any], path: str = "/v1/responses") -> Conversation:
    body = expect_dict(body, "request body")
    model = req_str(body, "model", "request")
    if body.get("previous_response_id"):
        raise bad("previous_response_id is not supported: Polar keeps no server-side state, "
                  "send the whole conversation in input")
    transcript = Transcript()
    transcript.add_system(opt_str(body, "instructions", "request") or "")
    raw = body.get("input")
    items = [{"role": "user", "content": raw}] if isinstance(raw, str) else expect_list(raw, "input")
    if not items:
        raise bad("input must not be empty")
    _add_items(transcript, items)
    return Conversation(
        api=API,
        model=model,
        messages=transcript.build(),
        tools=_tools(body.get("tools")),
        sampling=Sampling(
            max_tokens=opt_int(body, "max_output_tokens", "request"),
            temperature=opt_float(body, "temperature", "request"),
            top_p=opt_float(body, "top_p", "request"),
            top_k=opt_int(body, "top_k", "request"),
            seed=opt_int(body, "seed", "request"),
        ),
        stream=opt_bool(body, "stream", "request"),
    )


def encoder_options(body: dict[str, Any]) -> dict[str, Any]:
    """Extra StreamEncoder keyword arguments this request asks for (none for Responses)."""
    return {}


class _Turn:
    """The assistant-side items seen since the last user/tool item."""

    def __init__(self) -> None:
        self.content: list[str] = []
        self.reasoning: list[str] = []
        self.calls: list[ToolCall] = []

    def flush(self, transcript: Transcript) -> None:
        if self.content or self.reasoning or self.calls:
            transcript.add(assistant(self.content, self.reasoning, self.calls))
        self.__init__()


def _add_items(transcript: Transcript, items: list[Any]) -> None:
    turn = _Turn()
    for i, item in enumerate(items):
        where = f"input[{i}]"
        item = expect_dict(item, where)
        kind = item.get("type", "message")
        if kind == "message" and item.get("role") == "assistant":
            turn.content.append(join_text(item.get("content"), f"{where}.content", _TEXT, _MEDIA))
        elif kind == "reasoning":
            turn.reasoning.append(_reasoning_text(item, where))
        elif kind == "function_call":
            arguments = canonical_arguments(item.get("arguments"), f"{where}.arguments")
            turn.calls.append(ToolCall(req_str(item, "call_id", where), req_str(item, "name", where), arguments))
        elif kind == "custom_tool_call":
            arguments = dump_arguments({"input": opt_str(item, "input", where) or ""})
            turn.calls.append(ToolCall(req_str(item, "call_id", where), req_str(item, "name", where), arguments))
        else:
            turn.flush(transcript)
            _add_input(transcript, item, kind, where)
    turn.flush(transcript)


def _add_input(transcript: Transcript, item: dict[str, Any], kind: str, where: str) -> None:
    if kind in ("function_call_output", "custom_tool_call_output"):
        call_id = req_str(item, "call_id", where)
        output = join_text(item.get("output"), f"{where}.output", _TEXT, _MEDIA)
        transcript.add(Message("tool", output, tool_call_id=call_id, name=transcript.name_for(call_id)))
        return
    if kind != "message":
        raise bad(f"{where}: input item type {kind!r} is not supported")
    role = req_str(item, "role", where)
    text = join_text(item.get("content"), f"{where}.content", _TEXT, _MEDIA)
    if role in ("system", "developer"):
        transcript.add_system(text)
    elif role == "user":
        transcript.add(Message("user", text))
    else:
        raise bad(f"{where}.role {role!r} is not supported")


def _reasoning_text(item: dict[str, Any], where: str) -> str:
    decoded = decode_reasoning(item.get("encrypted_content"))
    if decoded is not None:
        return decoded
    for key in ("content", "summary"):
        text = join_text(item.get(key), f"{where}.{key}", _REASONING_TEXT)
        if text:
            return text
    return ""


def _tools(tools: Any) -> tuple[Tool, ...]:
    """`function` tools; built-in and custom tool types are not offered to the model (dropped)."""
    out: list[Tool] = []
    for i, tool in enumerate(expect_list(tools or [], "tools")):
        tool = expect_dict(tool, f"tools[{i}]")
        if tool.get("type") != "function":
            continue
        params = expect_dict(tool.get("parameters") or {}, f"tools[{i}].parameters")
        description = opt_str(tool, "description", f"tools[{i}]") or ""
        out.append(Tool(req_str(tool, "name", f"tools[{i}]"), description, params))
    return tuple(out)
