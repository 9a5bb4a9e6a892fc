"""How each model family writes a tool call in its reply text (issue 45): the tags around a call and the
parser of what is between them, one `CallFormat` per tool parser. polar_mitm/tokens/reply_parser.py finds the
tags in a streamed reply; these functions read one call's text. Harmony (gpt-oss) is a channel format of its own,
parsed there.

  hermes       <tool_call>{"name": …, "arguments": {…}}</tool_call>                      Qwen2.5/3, Hermes
  qwen3_coder  <tool_call><function=NAME><parameter=KEY>VALUE</parameter></function></tool_call>  Qwen3-Coder
  glm45        <tool_call>NAME<arg_key>KEY</arg_key><arg_value>VALUE</arg_value></tool_call>     GLM-4.5/4.6
  deepseek_v3  <｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME ```json {…}```<｜tool▁call▁end｜> (V3, R1),
               or NAME<｜tool▁sep｜>{…} (V3.1), inside <｜tool▁calls▁begin｜>…<｜tool▁calls▁end｜>
  kimi_k2      <|tool_call_begin|>functions.NAME:0<|tool_call_argument_begin|>{…}<|tool_call_end|>, inside
               <|tool_calls_section_begin|>…<|tool_calls_section_end|>
  mistral      [TOOL_CALLS][{"name": …, "arguments": {…}}, …] (v3/v7) or [TOOL_CALLS]NAME[ARGS]{…} (v11, with
               an optional [CALL_ID]ID), each call running to the next [TOOL_CALLS] or the end of the reply
  llama3_json  {"name": …, "parameters": {…}} as the whole reply, or after <|python_tag|>; several joined by ;
  tool_code    ```tool_code\nNAME(KEY=VALUE, …)\n```: Python calls with keyword arguments, one per line (or a list
               of them), the prompt-based form of Gemma 3 (polar_mitm/tokens/templates/gemma3_tools.jinja)
A VALUE in an XML-ish call (qwen3_coder, glm45) that is valid JSON is decoded, else kept as a string.
"""
from __future__ import annotations

import ast
import io
import json
import keyword
import re
import tokenize
from dataclasses import dataclass
from typing import Any, Callable

Call = tuple[str, dict[str, Any]]  # (name, arguments), or (name, arguments, the id the model wrote for the call)
MISTRAL_ID = re.compile(r"[A-Za-z0-9]{9}")  # Mistral's call ids: its chat templates refuse any other

_FUNCTION = re.compile(r"\s*<function=([^>\n]+)>(.*?)</function>\s*", re.S)
_PARAMETER = re.compile(r"<parameter=([^>\n]+)>(.*?)</parameter>", re.S)
_GLM_ARG = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.S)
_DEEPSEEK_FENCE = re.compile(r"\s*([^\n`]+?)\s*\n```(?:json)?\s*\n(.*?)\n?```\s*", re.S)
_KIMI_NAME = re.compile(r"\s*(?:functions\.)?([^\s:<]+)(?::\d+)?\s*", re.S)
_DS_SEP, _KIMI_ARGS = "<｜tool▁sep｜>", "<|tool_call_argument_begin|>"
_MISTRAL_ARGS, _MISTRAL_ID = "[ARGS]", "[CALL_ID]"


def json_object(text: str) -> dict[str, Any] | None:
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None


def _named_call(obj: Any) -> Call | None:
    """{"name": …, "arguments"|"parameters": {…} or its JSON text} → (name, arguments)."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    args = obj.get("arguments", obj.get("parameters"))
    if isinstance(args, str):
        args = json_object(args)
    elif args is None:
        args = {}
    return (obj["name"], args) if isinstance(args, dict) else None


def parse_hermes(body: str) -> tuple[str, dict[str, Any]] | None:
    """`{"name": …, "arguments": {…}}` → (name, arguments), or None when it does not parse."""
    return _named_call(json_object(body.strip()))


def _xml_value(raw: str) -> Any:
    raw = raw[1:] if raw.startswith("\n") else raw
    raw = raw[:-1] if raw.endswith("\n") else raw
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        return raw


def parse_qwen3_coder(body: str) -> tuple[str, dict[str, Any]] | None:
    """`<function=NAME><parameter=KEY>VALUE</parameter>…</function>` → (name, arguments), or None."""
    match = _FUNCTION.fullmatch(body)
    if match is None or not match.group(1).strip():
        return None
    args = _pairs(match.group(2), _PARAMETER)
    return None if args is None else (match.group(1).strip(), args)


def _pairs(inner: str, pattern: re.Pattern[str]) -> dict[str, Any] | None:
    """KEY/VALUE pairs that make up all of `inner` (whitespace between them aside), or None."""
    args: dict[str, Any] = {}
    end = 0
    for pair in pattern.finditer(inner):
        if inner[end:pair.start()].strip():
            return None
        args[pair.group(1).strip()] = _xml_value(pair.group(2))
        end = pair.end()
    return None if inner[end:].strip() else args


def parse_glm45(body: str) -> Call | None:
    """`NAME\n<arg_key>KEY</arg_key>\n<arg_value>VALUE</arg_value>…` → (name, arguments), or None."""
    name, tag, rest = body.partition("<arg_key>")
    name = name.strip()
    if not name or any(c in name for c in "<>\n"):
        return None
    args = _pairs(tag + rest, _GLM_ARG)
    return None if args is None else (name, args)


def parse_deepseek(body: str) -> Call | None:
    """V3/R1 `function<｜tool▁sep｜>NAME\n```json\n{…}\n```` or V3.1 `NAME<｜tool▁sep｜>{…}` → (name, arguments)."""
    head, sep, rest = body.partition(_DS_SEP)
    if not sep:
        return None
    fenced = _DEEPSEEK_FENCE.fullmatch(rest)
    name, args = (fenced.group(1), json_object(fenced.group(2))) if fenced else (head.strip(), json_object(rest))
    return (name, args) if name and args is not None else None


def parse_kimi_k2(body: str) -> Call | None:
    """`functions.NAME:INDEX<|tool_call_argument_begin|>{…}` → (name, arguments), or None."""
    head, sep, rest = body.partition(_KIMI_ARGS)
    named = _KIMI_NAME.fullmatch(head)
    args = json_object(rest)
    return (named.group(1), args) if sep and named and args is not None else None


def _mistral_id(value: Any) -> str | None:
    return value if isinstance(value, str) and MISTRAL_ID.fullmatch(value) else None


def parse_mistral(body: str) -> list[Call] | None:
    """After one [TOOL_CALLS]: a JSON list of calls (v3/v7), or `NAME[ARGS]{…}` with an optional
    `[CALL_ID]ID` before or after [ARGS] (v11). A call's id, when the model wrote a valid one, is kept: the
    harness sends it back, and the template renders the call as sampled."""
    text = body.strip()
    if text.startswith("["):
        try:
            items = json.loads(text)
        except json.JSONDecodeError:
            return None
        calls = [_named_call(i) for i in items] if isinstance(items, list) else [None]
        if not calls or None in calls:
            return None
        return [(*c, _mistral_id(i.get("id"))) for c, i in zip(calls, items)]  # type: ignore[misc]
    name, sep, args_text = text.partition(_MISTRAL_ARGS)
    name, _, id_before = name.partition(_MISTRAL_ID)
    args_text, _, id_after = args_text.partition(_MISTRAL_ID)
    name, args = name.strip(), json_object(args_text.strip()) if sep else None
    if not name or any(c in name for c in " []{}\n") or args is None:
        return None
    return [(name, args, _mistral_id((id_before or id_after).strip()))]


def parse_llama3_json(body: str) -> list[Call] | None:
    """One or more `{"name": …, "parameters": {…}}` joined by `;` (or whitespace) → calls, or None."""
    decoder, calls, at, text = json.JSONDecoder(), [], 0, body.strip()
    while at < len(text):
        try:
            obj, at = decoder.raw_decode(text, at)
        except json.JSONDecodeError:
            return None
        call = _named_call(obj)
        if call is None:
            return None
        calls.append(call)
        while at < len(text) and (text[at].isspace() or text[at] == ";"):
            at += 1
    return calls or None


# Names a model may write for JSON's constants in a Python call (the template writes values as JSON).
_NAMED_CONSTANTS = {"true": True, "false": False, "null": None, "True": True, "False": False, "None": None}


def _literal(node: ast.expr) -> Any:
    """A Python or JSON literal → its value; ValueError for anything else (a name, a call, an operation)."""
    if isinstance(node, ast.Constant) and (node.value is None or isinstance(node.value, (str, int, float))):
        return node.value  # (not bytes, complex or Ellipsis: no JSON for them)
    if isinstance(node, ast.Name) and node.id in _NAMED_CONSTANTS:
        return _NAMED_CONSTANTS[node.id]
    if isinstance(node, (ast.List, ast.Tuple)):
        return [_literal(e) for e in node.elts]
    if isinstance(node, ast.Dict) and None not in node.keys:
        return {_literal(k): _literal(v) for k, v in zip(node.keys, node.values)}  # type: ignore[arg-type]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and isinstance(node.operand, ast.Constant) \
            and isinstance(node.operand.value, (int, float)) and not isinstance(node.operand.value, bool):
        return -node.operand.value
    raise ValueError(ast.dump(node))


_KEYWORD = "__polar_keyword_"  # a tool or argument named like a Python keyword (`from`), renamed to parse
_HYPHEN = "__polar_hyphen__"  # a tool or argument named with hyphens (`web-search`), joined into one name to parse


def _unhyphen(source: str) -> str:
    """`source` with each hyphenated name written without spaces right before `(` or `=` (`web-search(`,
    `max-results=`) joined into one Python name by _HYPHEN: `a - b(…)` with spaces stays a subtraction."""
    tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    out: list[tuple[int, str]] = []
    i = 0
    while i < len(tokens):
        j = i  # tokens[i..j] alternate NAME, '-', NAME, … each touching the next
        while (tokens[j].type == tokenize.NAME and j + 2 < len(tokens) and tokens[j + 1].string == "-"
               and tokens[j + 2].type == tokenize.NAME and tokens[j].end == tokens[j + 1].start
               and tokens[j + 1].end == tokens[j + 2].start):
            j += 2
        after = tokens[j + 1] if j + 1 < len(tokens) else None
        if j > i and after is not None and after.string in ("(", "=") and tokens[j].end == after.start:
            out.append((tokenize.NAME, _HYPHEN.join(t.string for t in tokens[i:j + 1:2])))
        else:  # (a later start in the same run ends at the same token: no need to look again, so linear)
            out += [(t.type, t.string) for t in tokens[i:j + 1]]
        i = j + 1
    return tokenize.untokenize(out)


def _unkeyword(source: str) -> str:
    """`source` with each Python keyword used as a name (before `=` or `(`) renamed `_KEYWORD + name`: a
    tool's argument may well be called `from` or `class`. Tokenized, so text inside strings is never touched."""
    tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    out: list[tuple[int, str]] = []
    after: tokenize.TokenInfo | None = None  # the next token that is not a line break or a comment
    for t in reversed(tokens):
        renamed = t.type == tokenize.NAME and keyword.iskeyword(t.string) and t.string not in _NAMED_CONSTANTS \
            and after is not None and after.type == tokenize.OP and after.string in ("=", "(")
        out.append((t.type, _KEYWORD + t.string if renamed else t.string))
        if t.type not in (tokenize.NL, tokenize.COMMENT):
            after = t
    return tokenize.untokenize(reversed(out))


def _python_call(node: ast.expr) -> Call:
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print" \
            and len(node.args) == 1 and not node.keywords:
        node = node.args[0]  # print(NAME(…)): the form Gemma's cookbooks show
    if not isinstance(node, ast.Call) or node.args or not all(k.arg for k in node.keywords):
        raise ValueError("not a call with keyword arguments only")
    name = ast.unparse(node.func).replace(_KEYWORD, "").replace(_HYPHEN, "-")
    if not re.fullmatch(r"[A-Za-z_][\w.-]*", name):
        raise ValueError(name)
    return name, {k.arg.removeprefix(_KEYWORD).replace(_HYPHEN, "-"): _literal(k.value)  # type: ignore[union-attr]
                  for k in node.keywords}


def parse_tool_code(body: str) -> list[Call] | None:
    """A ```tool_code block's lines: `NAME(KEY=VALUE, …)` each (or `[A(…), B(…)]`), values Python or JSON
    literals → calls, or None when any part is something else. Never evaluated: read as a syntax tree."""
    try:
        tree = ast.parse(_unkeyword(_unhyphen(body.strip())), mode="exec")
        calls: list[Call] = []
        for statement in tree.body:
            if not isinstance(statement, ast.Expr):
                return None
            value = statement.value
            calls += [_python_call(e) for e in value.elts] if isinstance(value, (ast.List, ast.Tuple)) \
                else [_python_call(value)]
    except (SyntaxError, tokenize.TokenError, ValueError, TypeError, RecursionError):  # TypeError: unhashable key
        return None
    return calls or None


def _one(parse: Callable[[str], Call | None]) -> Callable[[str], list[Call] | None]:
    def parse_list(body: str) -> list[Call] | None:
        call = parse(body)
        return None if call is None else [call]
    return parse_list


@dataclass(frozen=True)
class CallFormat:
    """How one family marks a tool call in its reply text."""
    open: str
    close: str | None  # None: a call runs to the next `open` or to the end of the reply
    parse: Callable[[str], list[Call] | None]  # the text between the tags → calls, or None
    sections: tuple[str, ...] = ()  # tags around a group of calls: dropped
    bare_json: bool = False  # a reply that begins with `{` is a call (Llama 3's JSON tool calling)
    id_width: int | None = None  # the ids the proxy makes for calls: this many letters and digits (else any)


CALL_FORMATS: dict[str, CallFormat] = {
    "hermes": CallFormat("<tool_call>", "</tool_call>", _one(parse_hermes)),
    "qwen3_coder": CallFormat("<tool_call>", "</tool_call>", _one(parse_qwen3_coder)),
    "glm45": CallFormat("<tool_call>", "</tool_call>", _one(parse_glm45)),
    "deepseek_v3": CallFormat("<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", _one(parse_deepseek),
                              ("<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>")),
    "kimi_k2": CallFormat("<|tool_call_begin|>", "<|tool_call_end|>", _one(parse_kimi_k2),
                          ("<|tool_calls_section_begin|>", "<|tool_calls_section_end|>")),
    "mistral": CallFormat("[TOOL_CALLS]", None, parse_mistral, id_width=9),
    "llama3_json": CallFormat("<|python_tag|>", None, parse_llama3_json, bare_json=True),
    "tool_code": CallFormat("```tool_code", "```", parse_tool_code),
}
