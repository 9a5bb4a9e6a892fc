"""An oracle for recorded prompts, written apart from the proxy: does a CallRecord's `prompt_ids` hold what
the harness sent?

It reads only the raw provider request kept in the record (`record["request"]`), never polar_mitm's codecs or
prompt code, and checks that every text the harness sent (system prompts and instructions, user text, tool
results, assistant text and tool-call names) appears in `tokenizer.decode(prompt_ids)`, line by line, in the
order sent: top-level system prompts and instructions first, then each offered tool's name and description
(raw or JSON-escaped, or the description first; the tools all together may also come before the system prompts,
as Mistral's template writes them; none for a record flagged `template_dropped_tools`), then the turns. A
system/developer prompt inside the conversation may stay in its place or be hoisted into the leading system
message, still in order (the Chat and Responses codecs hoist them, the Anthropic codec keeps Claude Code's in
place). Whitespace is normalised per line, so a template may re-indent.
Reasoning (thinking blocks, reasoning items, thought parts) is not required: a harness may send it or drop it.
For an OpenAI Chat call rendered from scratch (not substituted) whose request has no reasoning artefacts, the
prompt must also equal the model's chat template applied to the request's own messages and tools.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, is_dataclass, replace
from typing import Any, Iterable


@dataclass(frozen=True)
class Sent:
    """One text the harness sent, and the forms the prompt may show it in (raw, or as JSON writes it)."""

    where: str
    forms: tuple[str, ...]
    system: bool = False  # a system/developer prompt inside the conversation: in place, or hoisted to the head


@dataclass(frozen=True)
class Request:
    system: list[Sent]
    tools: list[Sent]  # each offered tool's name and description, in the order offered
    turns: list[Sent]


def assert_prompt_faithful(record: Any, tokenizer: Any) -> None:
    """Raise AssertionError when the record's prompt_ids lost, changed or reordered a text the harness sent;
    ValueError when the request has a shape this oracle cannot read."""
    rec = asdict(record) if is_dataclass(record) else record
    ids, where = list(rec["prompt_ids"]), f"{rec['api']} call {rec['call_id']}"
    if not ids:
        assert rec["error"] is not None, f"{where}: no prompt_ids and no error"
        return  # refused before any prompt was built
    request = READERS[rec["api"]](rec["request"])
    if "template_dropped_tools" in (rec.get("flags") or ()):  # a template that renders no tools (SmolLM2's), and said so
        request = replace(request, tools=[])
    prompt = _normalise(tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False))
    _assert_in_order(prompt, request, where)
    if rec["api"] == "openai_chat" and rec["prefix_source"].startswith("rendered"):
        _assert_equals_chat_template(rec["request"], ids, tokenizer, where)


# ---------------------------------------------------------------- finding texts in order


def _assert_in_order(prompt: str, request: Request, where: str) -> None:
    cursor = 0
    for sent in request.system:
        cursor = _find(prompt, sent, cursor, where)
    head = cursor  # where system prompts hoisted out of the conversation continue, in order
    if _all_found(prompt, request.tools, cursor) is None and _all_found(prompt, request.tools, 0) is not None:
        pass  # all of them ahead of the system prompts: Mistral writes [AVAILABLE_TOOLS] before that [INST]
    else:
        for sent in request.tools:
            cursor = _find(prompt, sent, cursor, where)
    first = next((s for s in request.turns if not s.system), None)
    found = _search(prompt, first, cursor) if first else None
    head_end = found[0] if found else len(prompt)  # hoisted prompts lie before the first other turn
    for sent in request.turns:
        hoisted = _search(prompt[:head_end], sent, head) if sent.system else None
        if hoisted is not None:
            head = hoisted[1]
        else:
            cursor = _find(prompt, sent, cursor, where)


def _lines(text: str) -> list[str]:
    return [" ".join(line.split()) for line in text.splitlines() if line.strip()]


def _normalise(text: str) -> str:
    return "\n".join(_lines(text))


def _search(prompt: str, sent: Sent, cursor: int) -> tuple[int, int] | None:
    """Where one of `sent`'s forms starts and ends, its lines found in order from `cursor`."""
    for form in sent.forms:
        at, start = cursor, None
        for line in _lines(form):
            found = prompt.find(line, at)
            if found < 0:
                break
            start = found if start is None else start
            at = found + len(line)
        else:
            return (cursor if start is None else start), at
    return None


def _all_found(prompt: str, sents: list[Sent], cursor: int) -> int | None:
    """Where the last of `sents` ends when all are found in order from `cursor`, else None."""
    for sent in sents:
        found = _search(prompt, sent, cursor)
        if found is None:
            return None
        cursor = found[1]
    return cursor


def _find(prompt: str, sent: Sent, cursor: int, where: str) -> int:
    found = _search(prompt, sent, cursor)
    if found is not None:
        return found[1]
    at, missing = cursor, ""
    for line in _lines(sent.forms[0]):  # name the first line of the raw form that is missing
        found = prompt.find(line, at)
        if found < 0:
            missing = line
            break
        at = found + len(line)
    raise AssertionError(
        f"{where}: {sent.where} is not in the prompt in the order sent: line {missing[:200]!r} is missing after "
        f"prompt offset {at}; the prompt from there: {prompt[at:at + 400]!r}")


def _text(where: str, text: Any) -> list[Sent]:
    if not isinstance(text, str):
        raise ValueError(f"{where}: expected a string, got {type(text).__name__}")
    return [Sent(where, (text,))] if text.strip() else []


def _in_conversation_system(texts: list[Sent]) -> list[Sent]:
    return [Sent(s.where, s.forms, system=True) for s in texts]


def _part_texts(content: Any, where: str) -> list[Sent]:
    """Texts of a content that is a string, null, or a list of typed parts (non-text parts carry no text)."""
    if content is None:
        return []
    if isinstance(content, str):
        return _text(where, content)
    if not isinstance(content, list):
        raise ValueError(f"{where}: content must be a string, null or a list, got {type(content).__name__}")
    out: list[Sent] = []
    for i, part in enumerate(content):
        if isinstance(part, dict) and part.get("type") in ("text", "input_text", "output_text"):
            out += _text(f"{where}[{i}].text", part.get("text"))
    return out


def _tool(where: str, spec: dict[str, Any]) -> list[Sent]:
    """An offered tool's name, then its description raw or as JSON escapes it (templates show tools as JSON); or
    the description first (harmony's TypeScript: a `//` comment over `type NAME`)."""
    name, description = spec["name"], spec.get("description") or ""
    if not description.strip():
        return _text(f"{where}.name", name)
    escaped = json.dumps(description, ensure_ascii=False)[1:-1]
    return [Sent(f"{where} (name and description)",
                 (f"{name}\n{description}", f"{name}\n{escaped}", f"{description}\n{name}"))]


# ---------------------------------------------------------------- the four request shapes


def read_openai_chat(body: dict[str, Any]) -> Request:
    turns: list[Sent] = []
    for i, m in enumerate(body["messages"]):
        at = f"messages[{i}] ({m['role']})"
        texts = _part_texts(m.get("content"), f"{at}.content")
        turns += _in_conversation_system(texts) if m["role"] in ("system", "developer") else texts
        for j, call in enumerate(m.get("tool_calls") or []):
            turns += _text(f"{at}.tool_calls[{j}].name", call["function"]["name"])
    tools = [s for i, t in enumerate(body.get("tools") or []) if t.get("type") == "function"
             for s in _tool(f"tools[{i}]", t["function"])]
    return Request([], tools, turns)


def read_openai_responses(body: dict[str, Any]) -> Request:
    system = _text("instructions", body["instructions"]) if body.get("instructions") else []
    items = body.get("input") or []
    if isinstance(items, str):
        return Request(system, _responses_tools(body), _text("input", items))
    turns: list[Sent] = []
    for i, item in enumerate(items):
        kind, at = item.get("type", "message"), f"input[{i}]"
        if kind == "message":
            texts = _part_texts(item.get("content"), f"{at} ({item['role']}).content")
            turns += _in_conversation_system(texts) if item["role"] in ("system", "developer") else texts
        elif kind in ("function_call", "custom_tool_call"):
            turns += _text(f"{at}.name", item["name"])
        elif kind in ("function_call_output", "custom_tool_call_output"):
            turns += _part_texts(item.get("output"), f"{at}.output")
        elif kind != "reasoning":
            raise ValueError(f"{at}: the prompt oracle does not know input item type {kind!r}")
    return Request(system, _responses_tools(body), turns)


def _responses_tools(body: dict[str, Any]) -> list[Sent]:
    return [s for i, t in enumerate(body.get("tools") or []) if t.get("type") == "function"
            for s in _tool(f"tools[{i}]", t)]


def read_anthropic(body: dict[str, Any]) -> Request:
    system = _anthropic_blocks(body.get("system"), "system")
    turns: list[Sent] = []
    for i, m in enumerate(body["messages"]):
        at = f"messages[{i}] ({m['role']})"
        texts = _anthropic_blocks(m.get("content"), at)
        turns += _in_conversation_system(texts) if m["role"] == "system" else texts
    tools = [s for i, t in enumerate(body.get("tools") or []) if t.get("type") in (None, "custom")
             for s in _tool(f"tools[{i}]", t)]
    return Request(system, tools, turns)


def _anthropic_blocks(content: Any, at: str) -> list[Sent]:
    if content is None or isinstance(content, str):
        return _part_texts(content, at)
    out: list[Sent] = []
    for j, block in enumerate(content):
        kind, where = block.get("type"), f"{at}.content[{j}]"
        if kind == "text":
            out += _text(f"{where}.text", block["text"])
        elif kind == "tool_use":
            out += _text(f"{where}.name", block["name"])
        elif kind == "tool_result":
            out += _part_texts(block.get("content"), f"{where} (tool_result)")
        elif kind not in ("thinking", "redacted_thinking", "image", "document"):
            raise ValueError(f"{where}: the prompt oracle does not know block type {kind!r}")
    return out


def read_gemini(body: dict[str, Any]) -> Request:
    instruction = body.get("systemInstruction", body.get("system_instruction"))
    if isinstance(instruction, str):
        system = _text("systemInstruction", instruction)
    else:
        system = _gemini_parts((instruction or {}).get("parts") or [], "systemInstruction")
    turns: list[Sent] = []
    for i, content in enumerate(body["contents"]):
        turns += _gemini_parts(content.get("parts") or [], f"contents[{i}] ({content.get('role')})")
    tools = [s for i, t in enumerate(body.get("tools") or [])
             for j, d in enumerate(t.get("functionDeclarations", t.get("function_declarations")) or [])
             for s in _tool(f"tools[{i}].functionDeclarations[{j}]", d)]
    return Request(system, tools, turns)


def _gemini_parts(parts: list[dict[str, Any]], at: str) -> list[Sent]:
    out: list[Sent] = []
    for j, part in enumerate(parts):
        where = f"{at}.parts[{j}]"
        call = part.get("functionCall", part.get("function_call"))
        response = part.get("functionResponse", part.get("function_response"))
        if call is not None:
            out += _text(f"{where}.functionCall.name", call["name"])
        elif response is not None:
            out += _response_strings(response.get("response") or {}, f"{where}.functionResponse.response")
        elif "text" in part and not part.get("thought"):
            out += _text(f"{where}.text", part["text"])
    return out


def _response_strings(value: Any, where: str) -> list[Sent]:
    """Every string in a structured tool result, raw or as JSON escapes it (a template may show either)."""
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in _response_strings(v, f"{where}.{k}")]
    if isinstance(value, list):
        return [s for i, v in enumerate(value) for s in _response_strings(v, f"{where}[{i}]")]
    if isinstance(value, str) and value.strip():
        return [Sent(where, (value, json.dumps(value, ensure_ascii=False)[1:-1]))]
    return []


READERS = {"openai_chat": read_openai_chat, "openai_responses": read_openai_responses,
           "anthropic": read_anthropic, "gemini": read_gemini}


# ---------------------------------------------------------------- OpenAI Chat: the template itself

_REASONING_KEYS = ("reasoning_content", "reasoning", "reasoning_details", "thinking")


def _plain_chat(body: dict[str, Any]) -> bool:
    """A request the HF chat-template format expresses as is: one leading system message at most, text
    contents of at most one part, function tools, no reasoning artefacts."""
    messages = body.get("messages") or []
    for i, m in enumerate(messages):
        if m.get("role") not in ("system", "user", "assistant", "tool") or (m["role"] == "system" and i > 0):
            return False
        if any(key in m for key in _REASONING_KEYS):
            return False
        content = m.get("content")
        if isinstance(content, list) and (len(content) > 1 or any(p.get("type") != "text" for p in content)):
            return False
    return all(t.get("type") == "function" for t in body.get("tools") or [])


def _hf_message(m: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in m.items() if k in ("role", "content", "tool_call_id", "name")}
    if isinstance(out.get("content"), list):  # one text part (_plain_chat): its text, as templates take content
        out["content"] = "".join(p.get("text", "") for p in out["content"])
    if m.get("tool_calls"):
        out["tool_calls"] = [{"id": c.get("id"), "type": "function",
                              "function": {"name": c["function"]["name"],
                                           "arguments": _arguments(c["function"].get("arguments"))}}
                             for c in m["tool_calls"]]
    return out


def _arguments(text: Any) -> Any:
    """HF chat templates take tool-call arguments as an object; text that is not one stays text."""
    if not isinstance(text, str):
        return text if text is not None else {}
    try:
        value = json.loads(text or "{}")
    except json.JSONDecodeError:
        return text
    return value if isinstance(value, dict) else text


def _hf_tool(t: dict[str, Any]) -> dict[str, Any]:
    fn = t["function"]
    return {"type": "function", "function": {"name": fn["name"], "description": fn.get("description", ""),
                                             "parameters": fn.get("parameters", {})}}


def _assert_equals_chat_template(body: dict[str, Any], ids: Iterable[int], tokenizer: Any, where: str) -> None:
    if not _plain_chat(body):
        return
    tools = [_hf_tool(t) for t in body.get("tools") or []] or None
    text = tokenizer.apply_chat_template([_hf_message(m) for m in body["messages"]], tools=tools,
                                         add_generation_prompt=True, tokenize=False)
    expected = tokenizer(text, add_special_tokens=False)["input_ids"]
    got = list(ids)
    if got != expected:
        at = next((i for i, (a, b) in enumerate(zip(got, expected)) if a != b), min(len(got), len(expected)))
        raise AssertionError(
            f"{where}: prompt_ids differ from the chat template applied to the request at token {at} "
            f"({len(got)} vs {len(expected)} tokens): prompt {tokenizer.decode(got[at:at + 40])!r}, "
            f"template {tokenizer.decode(expected[at:at + 40])!r}")
