"""A scripted reply written the way a model family writes one (issue 45 item 5): its reasoning, content and tool
calls in the family's own markup, so the proxy's parsers meet the sequences a model of that family samples.

  format       reasoning              tool calls
  hermes       <think>…</think>       <tool_call>{"name": …, "arguments": {…}}</tool_call>
  qwen3_coder  <think>…</think>       <tool_call><function=NAME><parameter=KEY>VALUE</parameter></function></tool_call>
  glm45        <think>…</think>       <tool_call>NAME<arg_key>KEY</arg_key><arg_value>VALUE</arg_value></tool_call>
  deepseek_v3  <think>…</think>       <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME ```json …```…
  deepseek_v3_plain (none: dropped)  as deepseek_v3: DeepSeek V3 itself, which writes no reasoning
  kimi_k2      <think>…</think>       <|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:I…
  mistral      [THINK]…[/THINK]       [TOOL_CALLS]NAME[ARGS]{…} per call (v13: Magistral)
  mistral_v11  (none: dropped)        [TOOL_CALLS]NAME[CALL_ID]ID[ARGS]{…} per call (v11: Devstral), ID as v3's
  mistral_v3   (none: dropped)        [TOOL_CALLS][{"name": …, "arguments": {…}, "id": ID}, …] (v3/v7 Tekken: NeMo,
                                      Small), ID 9 letters and digits from the call's name, place and `salt`
  llama3_json  (none: dropped)        {"name": …, "parameters": {…}}; … (after <|python_tag|> when there is content)
  llama_models (none: dropped)        {"type": "function", "name": …, "parameters": {…}}… one after another, as
                                      llama-models encodes calls (Llama 3.1 with Polar's llama3_tools.jinja);
                                      after <|python_tag|> when there is content
  harmony      analysis channel       commentary to=functions.NAME <|constrain|>json, one message per call,
                                      ended by <|call|> (gpt-oss stops there: one call per reply on its vocabulary)
  tool_code    (none: dropped)        ```tool_code\nNAME(KEY=VALUE, …)\n…```, values as JSON (Gemma 3 with
                                      polar_mitm/tokens/templates/gemma3_tools.jinja, which renders past calls so)
Arguments given as text (a policy's raw JSON, possibly malformed on purpose) are written as they are.
"""
from __future__ import annotations

import hashlib
import json
from typing import Any, Sequence

REPLY_FORMATS = ("hermes", "qwen3_coder", "glm45", "deepseek_v3", "deepseek_v3_plain", "kimi_k2", "mistral",
                 "mistral_v3", "mistral_v11", "llama3_json", "llama_models", "harmony", "tool_code")

Call = tuple[str, Any]  # (name, arguments: a dict, or JSON text written as it is)


def _json(args: Any) -> str:
    return args if isinstance(args, str) else json.dumps(args if args is not None else {}, ensure_ascii=False)


def _json_or_none(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return None


def _value(value: Any) -> str:
    """An XML-ish parameter value: a string as it is, anything else as JSON."""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _items(args: Any) -> list[tuple[str, Any]]:
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return [("input", args)]  # raw text that is no object: one parameter, so nothing is lost
    return list(args.items()) if isinstance(args, dict) else [("input", args)]


def _hermes(name: str, args: Any) -> str:
    return f'<tool_call>\n{{"name": "{name}", "arguments": {_json(args)}}}\n</tool_call>'


def _qwen3_coder(name: str, args: Any) -> str:
    params = "".join(f"<parameter={k}>\n{_value(v)}\n</parameter>\n" for k, v in _items(args))
    return f"<tool_call>\n<function={name}>\n{params}</function>\n</tool_call>"


def _glm45(name: str, args: Any) -> str:
    pairs = "".join(f"<arg_key>{k}</arg_key>\n<arg_value>{_value(v)}</arg_value>\n" for k, v in _items(args))
    return f"<tool_call>{name}\n{pairs}</tool_call>"


def _mistral_id(name: str, index: int, salt: str) -> str:
    """A model makes a fresh id for every call; a harness may refuse one it saw before (the same tool_use id twice)."""
    return hashlib.sha256(f"{salt}/{name}/{index}".encode()).hexdigest()[:9]


def _tool_code(name: str, args: Any) -> str:
    if isinstance(args, str) and not isinstance(_json_or_none(args), dict):
        return f"{name}({args})"  # raw text that is no object (malformed on purpose?), written as it is
    return f"{name}(" + ", ".join(f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in _items(args)) + ")"


def write_reply(fmt: str, think: str | None, content: str, calls: Sequence[Call], salt: str = "") -> str:
    """The reply text in format `fmt` (one of REPLY_FORMATS); ValueError for another. `salt`: what makes this reply's
    call ids its own (the scripted policy gives the prompt's length and its tool results), where the format has ids."""
    if fmt in ("hermes", "qwen3_coder", "glm45"):
        one = {"hermes": _hermes, "qwen3_coder": _qwen3_coder, "glm45": _glm45}[fmt]
        text = "" if think is None else f"<think>\n{think}\n</think>\n\n"
        text += content
        for i, (name, args) in enumerate(calls):
            text += ("\n" if content or i else "") + one(name, args)
        return text
    if fmt == "deepseek_v3_plain":
        return write_reply("deepseek_v3", None, content, calls, salt)
    if fmt in ("deepseek_v3", "kimi_k2"):
        text = ("" if think is None else f"<think>{think}</think>") + content
        if not calls:
            return text
        if fmt == "deepseek_v3":
            body = "\n".join(f"<｜tool▁call▁begin｜>function<｜tool▁sep｜>{name}\n```json\n{_json(args)}\n```"
                             "<｜tool▁call▁end｜>" for name, args in calls)
            return text + f"<｜tool▁calls▁begin｜>{body}<｜tool▁calls▁end｜>"
        body = "".join(f"<|tool_call_begin|>functions.{name}:{i}<|tool_call_argument_begin|>{_json(args)}"
                       "<|tool_call_end|>" for i, (name, args) in enumerate(calls))
        return text + f"<|tool_calls_section_begin|>{body}<|tool_calls_section_end|>"
    if fmt == "mistral":
        text = ("" if think is None else f"[THINK]{think}[/THINK]") + content
        return text + "".join(f"[TOOL_CALLS]{name}[ARGS]{_json(args)}" for name, args in calls)
    if fmt == "mistral_v11":
        return content + "".join(f"[TOOL_CALLS]{name}[CALL_ID]{_mistral_id(name, i, salt)}[ARGS]{_json(args)}"
                                 for i, (name, args) in enumerate(calls))
    if fmt == "mistral_v3":
        if not calls:
            return content
        items = ", ".join(f'{{"name": "{name}", "arguments": {_json(args)}, "id": "{_mistral_id(name, i, salt)}"}}'
                          for i, (name, args) in enumerate(calls))
        return f"{content}[TOOL_CALLS][{items}]"
    if fmt in ("llama3_json", "llama_models"):
        if fmt == "llama3_json":
            body = "; ".join(f'{{"name": "{name}", "parameters": {_json(args)}}}' for name, args in calls)
        else:  # as llama-models' ChatFormat encodes a custom call (json.dumps), and so Polar's llama3_tools.jinja
            body = "".join(f'{{"type": "function", "name": {json.dumps(name)}, "parameters": '
                           f'{args if isinstance(args, str) else json.dumps(args)}}}' for name, args in calls)
        if not calls:
            return content
        return f"{content}<|python_tag|>{body}" if content else body
    if fmt == "harmony":  # each message ended as harmony ends it in history: <|end|>, a call <|call|>
        messages = [] if think is None else [f"<|channel|>analysis<|message|>{think}<|end|>"]
        if content:
            messages.append(f"<|channel|>{'commentary' if calls else 'final'}<|message|>{content}<|end|>")
        messages += [f" to=functions.{name}<|channel|>commentary <|constrain|>json<|message|>{_json(args)}<|call|>"
                     for name, args in calls]
        # a final answer ends at the stop token the server appends (gpt-oss's <|return|>); a call at <|call|>,
        # also a stop token of gpt-oss: a second call in one reply is never reached there, as with the model
        return "<|start|>assistant".join(messages).removesuffix("<|end|>")
    if fmt == "tool_code":
        if not calls:
            return content
        block = "```tool_code\n" + "".join(_tool_code(name, args) + "\n" for name, args in calls) + "```"
        return f"{content}\n{block}" if content else block
    raise ValueError(f"unknown reply format {fmt!r}; expected one of {', '.join(REPLY_FORMATS)}")
