"""OpenAI Responses codec (`POST /v1/responses`; codex, pi).

Request: `instructions` and system/developer input messages form one leading system message;
consecutive assistant-side items (`reasoning`, assistant `message`, `function_call`) form one
assistant turn; `function_call_output` items are tool results. A `reasoning` item's text is read
from the `encrypted_content` Polar made (see `_common.encode_reasoning`), else from its
`content` (reasoning_text), else from its `summary`. `custom_tool_call` items become calls with
arguments `{"input": …}`. Tools offered to the model: `function` tools; free-form `custom` tools (their
input is raw text, such as codex's `exec` and `apply_patch`) as a function of one string argument `input`,
their grammar in its description; the tools of a `namespace`, and of an `additional_tools` input item (codex
0.171's default model sends its tools there, namespaced). Built-in tool types (web_search, …) are dropped.
A reply calling a custom tool goes back as a `custom_tool_call` item with that input (`encoder_options`
names them). `previous_response_id` is refused (Polar keeps no server state). Image/file/audio parts become
a text placeholder.
Response and SSE: see `_responses_out` (re-exported here).
"""
from __future__ import annotations

from typing import Any

from polar_mitm.conversation import Conversation, Message, ProviderError, Sampling, Tool, ToolCall
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
    items = _input_items(body)
    if not items:
        raise bad("input must not be empty")
    _add_items(transcript, items)
    return Conversation(
        api=API,
        model=model,
        messages=transcript.build(),
        tools=tuple(tool for tool, _custom in _offered(body)),
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
    """Extra StreamEncoder (and render_response) keyword arguments: the custom tools this request offers, whose
    calls go back as custom_tool_call items."""
    try:
        custom = frozenset(tool.name for tool, is_custom in _offered(body) if is_custom)
    except ProviderError:  # a body parse_request refused never gets a reply
        custom = frozenset()
    return {"custom_tools": custom} if custom else {}


def _input_items(body: dict[str, Any]) -> list[Any]:
    raw = body.get("input")
    return [{"role": "user", "content": raw}] if isinstance(raw, str) else expect_list(raw, "input")


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
        elif kind == "additional_tools":
            continue  # tools, not a turn: offered with the body's (_offered)
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
        raise bad(f"{where}: input item type {kind!r} is not supported (Polar reads message, reasoning, "
                  "function_call, custom_tool_call, their outputs, and additional_tools)")
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


def _offered(body: dict[str, Any]) -> list[tuple[Tool, bool]]:
    """(tool, whether it is custom) for each tool the model is offered: the body's `tools`, then those of each
    `additional_tools` input item, namespaces opened, built-in types dropped."""
    found = _tools(body.get("tools"), "tools")
    raw = body.get("input")
    for i, item in enumerate(raw if isinstance(raw, list) else []):
        if isinstance(item, dict) and item.get("type") == "additional_tools":
            found += _tools(item.get("tools"), f"input[{i}].tools")
    return found


def _tools(tools: Any, where: str) -> list[tuple[Tool, bool]]:
    out: list[tuple[Tool, bool]] = []
    for i, tool in enumerate(expect_list(tools or [], where)):
        at = f"{where}[{i}]"
        tool = expect_dict(tool, at)
        kind = tool.get("type")
        if kind == "namespace":
            out += _tools(tool.get("tools"), f"{at}.tools")
        elif kind == "function":
            params = expect_dict(tool.get("parameters") or {}, f"{at}.parameters")
            out.append((Tool(req_str(tool, "name", at), opt_str(tool, "description", at) or "", params), False))
        elif kind == "custom":
            out.append((_custom_tool(tool, at), True))
    return out


def _custom_tool(tool: dict[str, Any], where: str) -> Tool:
    """A free-form tool as a function of one string: its input, raw text in the format it names."""
    description = opt_str(tool, "description", where) or ""
    fmt = tool.get("format")
    if isinstance(fmt, dict) and fmt.get("type") == "grammar" and isinstance(fmt.get("definition"), str):
        description += f"\n\nThe input follows this {fmt.get('syntax') or 'grammar'} grammar:\n{fmt['definition']}"
    params = {"type": "object", "properties": {"input": {"type": "string", "description": "the raw input text"}},
              "required": ["input"]}
    return Tool(req_str(tool, "name", where), description.strip(), params)
