"""The conversation as the harness saw it, as OpenAI-chat-like messages, from any of the four provider shapes.

Input: a call's stored `request` (the provider request as received) and `response` (the reply sent, as
one JSON object). Output: {"messages": [...], "tools": [...]}, where a message is
    {"role": "system"|"user"|"assistant"|"tool", "content": str,
     "reasoning_content"?: str, "tool_calls"?: [{"id", "type": "function", "function": {"name", "arguments"}}],
     "tool_call_id"?: str, "name"?: str}
and tools are {"type": "function", "function": {"name", "description", "parameters"}} (other tool kinds
are passed through as sent). Images and other non-text parts are dropped; reasoning is kept as text.
"""
from __future__ import annotations

import json
from typing import Any, Callable

Message = dict[str, Any]


def conversation_messages(api: str, request: dict[str, Any], response: dict[str, Any] | None) -> dict[str, Any]:
    try:
        reader = _READERS[api]
    except KeyError:
        raise ValueError(f"unknown api {api!r}") from None
    turns = _Turns()
    tools = reader(request or {}, response if isinstance(response, dict) else None, turns)
    return {"messages": turns.messages, "tools": tools}


class _Turns:
    """Collects messages; consecutive assistant pieces (reasoning, text, tool calls) form one message."""

    def __init__(self) -> None:
        self.messages: list[Message] = []
        self._open = False  # the last message is an assistant message still being assembled

    def add(self, role: str, content: str, **extra: Any) -> Message:
        message = {"role": role, "content": content, **{k: v for k, v in extra.items() if v is not None}}
        self.messages.append(message)
        self._open = role == "assistant"
        return message

    def assistant(self) -> Message:
        return self.messages[-1] if self._open else self.add("assistant", "")

    def close(self) -> None:
        self._open = False

    def text(self, text: str) -> None:
        message = self.assistant()
        message["content"] += text

    def reasoning(self, text: str) -> None:
        if text:
            message = self.assistant()
            message["reasoning_content"] = message.get("reasoning_content", "") + text

    def tool_call(self, call_id: str, name: str, arguments: Any) -> None:
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments, ensure_ascii=False)
        call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
        self.assistant().setdefault("tool_calls", []).append(call)


def _text(content: Any) -> str:
    """Text of a string or of a list of typed parts (text / input_text / output_text)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text") or "" for p in content if isinstance(p, dict)
                       and p.get("type", "text") in ("text", "input_text", "output_text"))
    return str(content)


def _function_tool(name: str, description: str | None, parameters: Any) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "description": description or "",
                                             "parameters": parameters or {"type": "object", "properties": {}}}}


# --- openai_chat ---------------------------------------------------------------------------------
def _read_openai_chat(request: dict[str, Any], response: dict[str, Any] | None, turns: _Turns) -> list[Any]:
    for m in request.get("messages") or []:
        _chat_message(m, turns)
    if response:
        choices = response.get("choices") or [{}]
        _chat_message({"role": "assistant", **(choices[0].get("message") or {})}, turns)
    return [t for t in request.get("tools") or []]


def _chat_message(m: dict[str, Any], turns: _Turns) -> None:
    role = "system" if m.get("role") == "developer" else m.get("role", "user")
    turns.close()
    if role != "assistant":
        turns.add(role, _text(m.get("content")), tool_call_id=m.get("tool_call_id"), name=m.get("name"))
        return
    turns.reasoning(m.get("reasoning_content") or m.get("reasoning") or "")
    turns.text(_text(m.get("content")))
    for call in m.get("tool_calls") or []:
        fn = call.get("function") or {}
        turns.tool_call(call.get("id", ""), fn.get("name", ""), fn.get("arguments", ""))


# --- openai_responses ----------------------------------------------------------------------------
def _read_openai_responses(request: dict[str, Any], response: dict[str, Any] | None, turns: _Turns) -> list[Any]:
    if request.get("instructions"):
        turns.add("system", _text(request["instructions"]))
    items = request.get("input")
    if isinstance(items, str):
        turns.add("user", items)
        items = []
    for item in list(items or []) + list((response or {}).get("output") or []):
        _responses_item(item, turns)
    tools = []
    for t in request.get("tools") or []:
        tools.append(_function_tool(t.get("name", ""), t.get("description"), t.get("parameters"))
                     if t.get("type") == "function" else t)
    return tools


def _responses_item(item: dict[str, Any], turns: _Turns) -> None:
    kind = item.get("type") or ("message" if "role" in item else None)
    if kind == "message":
        role = {"developer": "system"}.get(item.get("role", "user"), item.get("role", "user"))
        if role == "assistant":
            turns.text(_text(item.get("content")))
        else:
            turns.add(role, _text(item.get("content")))
            turns.close()
    elif kind == "reasoning":
        parts = (item.get("summary") or []) + (item.get("content") or [])
        turns.reasoning("".join(p.get("text") or "" for p in parts if isinstance(p, dict)))
    elif kind in ("function_call", "custom_tool_call"):
        turns.tool_call(item.get("call_id") or item.get("id", ""), item.get("name", ""),
                        item.get("arguments", item.get("input", "")))
    elif kind in ("function_call_output", "custom_tool_call_output"):
        turns.add("tool", _text(item.get("output")), tool_call_id=item.get("call_id"))
        turns.close()


# --- anthropic -----------------------------------------------------------------------------------
def _read_anthropic(request: dict[str, Any], response: dict[str, Any] | None, turns: _Turns) -> list[Any]:
    if request.get("system"):
        turns.add("system", _text(request["system"]))
        turns.close()
    messages = list(request.get("messages") or [])
    if response:
        messages.append({"role": "assistant", "content": response.get("content") or []})
    for m in messages:
        blocks = m.get("content")
        blocks = [{"type": "text", "text": blocks}] if isinstance(blocks, str) else blocks or []
        if m.get("role") == "assistant":
            turns.close()
            for b in blocks:
                _anthropic_assistant_block(b, turns)
        else:
            _anthropic_user_blocks(blocks, turns)
    tools = []
    for t in request.get("tools") or []:
        tools.append(_function_tool(t["name"], t.get("description"), t.get("input_schema"))
                     if "input_schema" in t else t)
    return tools


def _anthropic_assistant_block(b: dict[str, Any], turns: _Turns) -> None:
    if b.get("type") == "text":
        turns.text(b.get("text") or "")
    elif b.get("type") == "thinking":
        turns.reasoning(b.get("thinking") or "")
    elif b.get("type") in ("tool_use", "server_tool_use"):
        turns.tool_call(b.get("id", ""), b.get("name", ""), b.get("input") or {})


def _anthropic_user_blocks(blocks: list[dict[str, Any]], turns: _Turns) -> None:
    texts = []
    for b in blocks:
        if b.get("type") == "tool_result":
            turns.add("tool", _text(b.get("content")), tool_call_id=b.get("tool_use_id"))
        elif b.get("type") == "text":
            texts.append(b.get("text") or "")
    turns.close()
    if texts or not blocks:
        turns.add("user", "".join(texts))
        turns.close()


# --- gemini --------------------------------------------------------------------------------------
def _get(d: dict[str, Any], camel: str, snake: str) -> Any:
    return d.get(camel, d.get(snake))


def _read_gemini(request: dict[str, Any], response: dict[str, Any] | None, turns: _Turns) -> list[Any]:
    system = _get(request, "systemInstruction", "system_instruction")
    if system:
        turns.add("system", "".join(p.get("text") or "" for p in system.get("parts") or []))
        turns.close()
    contents = list(request.get("contents") or [])
    if response:
        candidate = (response.get("candidates") or [{}])[0]
        contents.append({"role": "model", **(candidate.get("content") or {"parts": []})})
    pending: dict[str, list[str]] = {}  # function name -> ids of calls not yet answered
    for n, content in enumerate(contents):
        turns.close()
        parts = content.get("parts") or []
        if content.get("role") == "model":
            for k, part in enumerate(parts):
                _gemini_model_part(part, f"call_{n}_{k}", pending, turns)
        else:
            _gemini_user_parts(parts, pending, turns)
    tools = []
    for t in request.get("tools") or []:
        for fn in _get(t, "functionDeclarations", "function_declarations") or []:
            params = fn.get("parameters") or _get(fn, "parametersJsonSchema", "parameters_json_schema")
            tools.append(_function_tool(fn.get("name", ""), fn.get("description"), params))
    return tools


def _gemini_model_part(part: dict[str, Any], new_id: str, pending: dict[str, list[str]], turns: _Turns) -> None:
    call = _get(part, "functionCall", "function_call")
    if call:
        call_id = call.get("id") or new_id  # Gemini matches results by name; ids are made up when absent
        pending.setdefault(call.get("name", ""), []).append(call_id)
        turns.tool_call(call_id, call.get("name", ""), call.get("args") or {})
    elif "text" in part:
        (turns.reasoning if part.get("thought") else turns.text)(part.get("text") or "")


def _gemini_user_parts(parts: list[dict[str, Any]], pending: dict[str, list[str]], turns: _Turns) -> None:
    texts = []
    for part in parts:
        result = _get(part, "functionResponse", "function_response")
        if result:
            name = result.get("name", "")
            waiting = pending.get(name) or []
            call_id = result.get("id") or (waiting.pop(0) if waiting else None)
            turns.add("tool", json.dumps(result.get("response"), ensure_ascii=False), tool_call_id=call_id, name=name)
        elif "text" in part:
            texts.append(part.get("text") or "")
    turns.close()
    if texts or not parts:
        turns.add("user", "".join(texts))
        turns.close()


_READERS: dict[str, Callable[[dict[str, Any], dict[str, Any] | None, _Turns], list[Any]]] = {
    "openai_chat": _read_openai_chat,
    "openai_responses": _read_openai_responses,
    "anthropic": _read_anthropic,
    "gemini": _read_gemini,
}
