"""Parse sampled reply text into reasoning, content and tool calls, incrementally.

`ReplyParser.feed(delta)` returns the events that are final so far; `finish()` flushes the rest.
Feeding a text in any split gives the same events (concatenated) and the same result as
`parse_reply(text)`, so a streamed reply and a non-streamed one are identical.

Rules:
- `<think>…</think>` is reasoning (several blocks are joined by a newline); with
  `starts_in_reasoning=True` the reply begins inside reasoning (the template opened `<think>`).
- `<tool_call>…</tool_call>` holds one call: hermes JSON `{"name": …, "arguments": {…}}` or
  qwen3-coder XML `<function=NAME><parameter=KEY>VALUE</parameter></function>` (a VALUE that is
  valid JSON is decoded, else kept as a string). A call that does not parse, or is never closed,
  is returned as content text and flagged `unparsed_tool_call`, never dropped.
- Content and reasoning are trimmed: whitespace next to a tag or at either end is dropped, and
  the pieces of content around tool calls are joined by a newline.
- A possible tag prefix at the end of the text seen so far is held back, never emitted as text.
"""
from __future__ import annotations

import json
import re
from typing import Any, NamedTuple

from polar_mitm.conversation import ContentDelta, ReasoningDelta, ReplyEvent, ToolCall, ToolCallDone

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
TOOL_PARSERS = ("hermes", "qwen3_coder")
REASONING_PARSERS = ("think",)
UNPARSED_TOOL_CALL = "unparsed_tool_call"
UNCLOSED_REASONING = "unclosed_reasoning"

_FUNCTION = re.compile(r"\s*<function=([^>\n]+)>(.*?)</function>\s*", re.S)
_PARAMETER = re.compile(r"<parameter=([^>\n]+)>(.*?)</parameter>", re.S)


class ParsedReply(NamedTuple):
    content: str
    reasoning: str | None
    tool_calls: tuple[ToolCall, ...]
    flags: tuple[str, ...]


class _Channel:
    """Content or reasoning text: segments trimmed and joined by a newline, emitted as soon as final."""

    def __init__(self) -> None:
        self._out: list[str] = []  # what was emitted, in order
        self._held = ""  # trailing whitespace, emitted only if more text follows in this segment
        self._fresh = True  # at a segment start: leading whitespace is dropped

    @property
    def text(self) -> str:
        return "".join(self._out)

    def push(self, text: str) -> str:
        if self._fresh:
            text = text.lstrip()
            if not text:
                return ""
            self._fresh = False
            pending = "\n" if self._out else ""
        else:
            pending = self._held
        body = text.rstrip()
        if not body:
            self._held = pending + text
            return ""
        self._held = text[len(body):]
        self._out.append(pending + body)
        return pending + body

    def end_segment(self) -> None:
        self._held = ""
        self._fresh = True


def _partial_tag_len(text: str, tags: tuple[str, ...]) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of one of `tags`."""
    for size in range(min(len(text), max(len(t) for t in tags) - 1), 0, -1):
        tail = text[-size:]
        if any(t.startswith(tail) for t in tags):
            return size
    return 0


def _json_object(text: str) -> dict[str, Any] | None:
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None


def parse_hermes(body: str) -> tuple[str, dict[str, Any]] | None:
    """`{"name": …, "arguments": {…}}` → (name, arguments), or None when it does not parse."""
    obj = _json_object(body.strip())
    if obj is None or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    args = obj.get("arguments", obj.get("parameters"))
    if isinstance(args, str):
        args = _json_object(args)
    elif args is None:
        args = {}
    return (obj["name"], args) if isinstance(args, dict) else None


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
    args: dict[str, Any] = {}
    inner, end = match.group(2), 0
    for param in _PARAMETER.finditer(inner):
        if inner[end:param.start()].strip():
            return None
        args[param.group(1).strip()] = _xml_value(param.group(2))
        end = param.end()
    if inner[end:].strip():
        return None
    return match.group(1).strip(), args


_PARSE_CALL = {"hermes": parse_hermes, "qwen3_coder": parse_qwen3_coder}


class ReplyParser:
    """Incremental parser of one reply; see the module docstring for the rules."""

    def __init__(
        self,
        tool_parser: str | None = "hermes",
        reasoning_parser: str | None = "think",
        *,
        starts_in_reasoning: bool = False,
        call_id_prefix: str = "call_",
    ) -> None:
        tool_parser = tool_parser.replace("-", "_") if tool_parser not in (None, "none") else None
        reasoning_parser = reasoning_parser if reasoning_parser != "none" else None
        if tool_parser is not None and tool_parser not in TOOL_PARSERS:
            raise ValueError(f"unknown tool parser {tool_parser!r}; expected one of {TOOL_PARSERS}")
        if reasoning_parser is not None and reasoning_parser not in REASONING_PARSERS:
            raise ValueError(f"unknown reasoning parser {reasoning_parser!r}; expected one of {REASONING_PARSERS}")
        if starts_in_reasoning and reasoning_parser is None:
            raise ValueError("starts_in_reasoning needs a reasoning parser")
        self._tool_parser = tool_parser
        self._reasoning_parser = reasoning_parser
        self._call_id_prefix = call_id_prefix
        self._mode = "reasoning" if starts_in_reasoning else "content"
        self._buf = ""
        self._scan_from = 0  # in tool mode: where to resume looking for the closing tag
        self._content = _Channel()
        self._reasoning = _Channel()
        self._calls: list[ToolCall] = []
        self._flags: list[str] = []
        self._finished = False

    # ------------------------------------------------------------ results

    @property
    def content(self) -> str:
        return self._content.text

    @property
    def reasoning(self) -> str | None:
        return self._reasoning.text or None

    @property
    def tool_calls(self) -> tuple[ToolCall, ...]:
        return tuple(self._calls)

    @property
    def flags(self) -> tuple[str, ...]:
        return tuple(self._flags)

    def result(self) -> ParsedReply:
        """The parsed reply; final once `finish()` was called."""
        return ParsedReply(self.content, self.reasoning, self.tool_calls, self.flags)

    # ------------------------------------------------------------ feeding

    def feed(self, text_delta: str) -> list[ReplyEvent]:
        if self._finished:
            raise RuntimeError("feed() after finish()")
        self._buf += text_delta
        events: list[ReplyEvent] = []
        while True:
            tags = self._tags()
            found = self._find(tags)
            if found is None:
                if self._mode != "tool":
                    keep = _partial_tag_len(self._buf, tags) if tags else 0
                    ready, self._buf = self._buf[: len(self._buf) - keep], self._buf[len(self._buf) - keep:]
                    events += self._text(ready)
                return events
            pos, tag = found
            before, self._buf, self._scan_from = self._buf[:pos], self._buf[pos + len(tag):], 0
            events += self._on_tag(before, tag)

    def finish(self) -> list[ReplyEvent]:
        if self._finished:
            return []
        rest, self._buf = self._buf, ""
        if self._mode == "tool":
            events = self._unparsed(CALL_OPEN + rest)
        else:
            events = self._text(rest)
            if self._mode == "reasoning":
                self._flag(UNCLOSED_REASONING)
        self._content.end_segment()
        self._reasoning.end_segment()
        self._finished = True
        return events

    # ------------------------------------------------------------ internals

    def _tags(self) -> tuple[str, ...]:
        if self._mode == "reasoning":
            return (THINK_CLOSE,)
        if self._mode == "tool":
            return (CALL_CLOSE,)
        opening = (CALL_OPEN,) if self._tool_parser else ()
        return opening + ((THINK_OPEN,) if self._reasoning_parser else ())

    def _find(self, tags: tuple[str, ...]) -> tuple[int, str] | None:
        hits = [(self._buf.find(t, self._scan_from), t) for t in tags]
        hits = [(pos, t) for pos, t in hits if pos >= 0]
        if not hits and self._mode == "tool":
            self._scan_from = max(0, len(self._buf) - len(CALL_CLOSE) + 1)
        return min(hits) if hits else None

    def _text(self, text: str) -> list[ReplyEvent]:
        if self._mode == "reasoning":
            out = self._reasoning.push(text)
            return [ReasoningDelta(out)] if out else []
        out = self._content.push(text)
        return [ContentDelta(out)] if out else []

    def _on_tag(self, before: str, tag: str) -> list[ReplyEvent]:
        if tag == CALL_CLOSE:
            self._mode = "content"
            return self._tool_call(before)
        events = self._text(before)
        if tag == THINK_CLOSE:
            self._reasoning.end_segment()
            self._mode = "content"
        else:
            self._content.end_segment()
            self._mode = "tool" if tag == CALL_OPEN else "reasoning"
        return events

    def _tool_call(self, body: str) -> list[ReplyEvent]:
        parsed = _PARSE_CALL[self._tool_parser](body) if self._tool_parser else None
        if parsed is None:
            return self._unparsed(CALL_OPEN + body + CALL_CLOSE)
        name, args = parsed
        index = len(self._calls)
        call = ToolCall(f"{self._call_id_prefix}{index}", name, json.dumps(args, ensure_ascii=False))
        self._calls.append(call)
        return [ToolCallDone(index, call)]

    def _unparsed(self, raw: str) -> list[ReplyEvent]:
        self._flag(UNPARSED_TOOL_CALL)
        out = self._content.push(raw)
        self._content.end_segment()
        return [ContentDelta(out)] if out else []

    def _flag(self, flag: str) -> None:
        if flag not in self._flags:
            self._flags.append(flag)


def parse_reply(
    text: str,
    tool_parser: str | None = "hermes",
    reasoning_parser: str | None = "think",
    *,
    starts_in_reasoning: bool = False,
    call_id_prefix: str = "call_",
) -> ParsedReply:
    """The whole reply at once (the non-streamed path): feed everything, then finish."""
    parser = ReplyParser(
        tool_parser, reasoning_parser, starts_in_reasoning=starts_in_reasoning, call_id_prefix=call_id_prefix
    )
    parser.feed(text)
    parser.finish()
    return parser.result()


def finish_reason(engine_finish_reason: str, reply: ParsedReply) -> str:
    """Completion.finish_reason from the engine's reason and the parsed reply."""
    if engine_finish_reason == "length":
        return "length"
    return "tool_calls" if reply.tool_calls else "stop"
