"""Parse sampled reply text into reasoning, content and tool calls, incrementally.

`ReplyParser.feed(delta)` returns the events that are final so far; `finish()` flushes the rest.
Feeding a text in any split gives the same events (concatenated) and the same result as
`parse_reply(text)`, so a streamed reply and a non-streamed one are identical.

Each model family writes tool calls its own way (issue 45): the tags and the reading of one call are in
polar_mitm/tokens/call_formats.py (hermes, qwen3_coder, glm45, deepseek_v3, kimi_k2, mistral, llama3_json); gpt-oss's
harmony channels are parsed here (HarmonyParser): analysis is reasoning, final (and commentary to no one) content,
commentary to=functions.NAME a call.
Reasoning: `think` (<think>…</think>, Qwen3, DeepSeek R1, GLM, Kimi) or `mistral` ([THINK]…[/THINK], Magistral);
with `starts_in_reasoning=True` the reply begins inside reasoning (the template opened it). Several blocks are
joined by a newline.

Rules:
- A call that does not parse, or is never closed, is returned as content text and flagged
  `unparsed_tool_call`, never dropped (a bare llama3 reply that is JSON but not a call is plain content).
- Content and reasoning are trimmed: whitespace next to a tag or at either end is dropped, and
  the pieces of content around tool calls are joined by a newline. Section tags around calls are dropped.
- A possible tag prefix at the end of the text seen so far is held back, never emitted as text.
"""
from __future__ import annotations

import json
import re
from typing import Any, NamedTuple

from polar_mitm.conversation import ContentDelta, ReasoningDelta, ReplyEvent, ToolCall, ToolCallDone
from polar_mitm.tokens.call_formats import CALL_FORMATS, json_object

UNPARSED_TOOL_CALL = "unparsed_tool_call"
UNCLOSED_REASONING = "unclosed_reasoning"
REASONING_TAGS = {"think": ("<think>", "</think>"), "mistral": ("[THINK]", "[/THINK]")}


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


TOOL_PARSERS = (*CALL_FORMATS, "harmony")
REASONING_PARSERS = (*REASONING_TAGS, "harmony")


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
        if tool_parser is not None and tool_parser not in CALL_FORMATS:
            raise ValueError(f"unknown tool parser {tool_parser!r}; expected one of {TOOL_PARSERS}")
        if reasoning_parser is not None and reasoning_parser not in REASONING_TAGS:
            raise ValueError(f"unknown reasoning parser {reasoning_parser!r}; expected one of {REASONING_PARSERS} "
                             "(harmony goes with the harmony tool parser)")
        if starts_in_reasoning and reasoning_parser is None:
            raise ValueError("starts_in_reasoning needs a reasoning parser")
        self._format = CALL_FORMATS[tool_parser] if tool_parser else None
        self._think = REASONING_TAGS[reasoning_parser] if reasoning_parser else None
        self._call_id_prefix = call_id_prefix
        self._mode = "reasoning" if starts_in_reasoning else "content"
        self._at_start = bool(self._format and self._format.bare_json) and not starts_in_reasoning
        self._opened_by = ""  # in tool mode: the tag that opened the call ("" for a bare JSON reply)
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
        if self._at_start:  # Llama 3: whether the reply is a bare JSON call shows at its first character
            if not self._buf.strip():
                return []
            self._at_start = False
            if self._buf.lstrip().startswith("{"):
                self._mode, self._opened_by = "tool", ""
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
            closed = self._format is not None and self._format.close is None  # the end of the reply closes it
            events = self._tool_calls(rest) if closed else self._unparsed(self._opened_by + rest)
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
        fmt = self._format
        if self._mode == "reasoning":
            return (self._think[1],) if self._think else ()
        if self._mode == "tool":
            assert fmt is not None
            return (fmt.close or fmt.open,)
        opening = (fmt.open, *fmt.sections) if fmt else ()
        return opening + ((self._think[0],) if self._think else ())

    def _find(self, tags: tuple[str, ...]) -> tuple[int, str] | None:
        hits = [(self._buf.find(t, self._scan_from), t) for t in tags]
        hits = [(pos, t) for pos, t in hits if pos >= 0]
        if not hits and self._mode == "tool":
            self._scan_from = max(0, len(self._buf) - len(tags[0]) + 1)
        return min(hits) if hits else None

    def _text(self, text: str) -> list[ReplyEvent]:
        if self._mode == "reasoning":
            out = self._reasoning.push(text)
            return [ReasoningDelta(out)] if out else []
        out = self._content.push(text)
        return [ContentDelta(out)] if out else []

    def _on_tag(self, before: str, tag: str) -> list[ReplyEvent]:
        fmt = self._format
        if self._mode == "tool":
            assert fmt is not None
            events = self._tool_calls(before, tag if fmt.close else "")
            if fmt.close is None:  # the next call's [TOOL_CALLS] (or <|python_tag|>) ends this one
                self._opened_by = tag
            else:
                self._mode = "content"
            return events
        events = self._text(before)
        if self._mode == "reasoning":
            self._reasoning.end_segment()
            self._mode = "content"
        elif fmt is not None and tag == fmt.open:
            self._content.end_segment()
            self._mode, self._opened_by = "tool", tag
        elif fmt is not None and tag in fmt.sections:
            self._content.end_segment()
        else:
            self._content.end_segment()
            self._mode = "reasoning"
        return events

    def _tool_calls(self, body: str, close: str = "") -> list[ReplyEvent]:
        parsed = self._format.parse(body) if self._format else None
        if not parsed:
            if not self._opened_by and self._format and self._format.bare_json:  # JSON content, not a call
                out = self._content.push(body)
                return [ContentDelta(out)] if out else []
            return self._unparsed(self._opened_by + body + close)
        return [self._call(*c) for c in parsed]

    def _call(self, name: str, args: dict[str, Any], model_id: str | None = None) -> ToolCallDone:
        index = len(self._calls)
        call = ToolCall(model_id or self._new_id(index), name, json.dumps(args, ensure_ascii=False))
        self._calls.append(call)
        return ToolCallDone(index, call)

    def _new_id(self, index: int) -> str:
        width = self._format.id_width if self._format else None
        if width is None:
            return f"{self._call_id_prefix}{index}"
        # letters and digits only (Mistral's templates refuse other ids): the call's own random part, then the index
        unique = re.sub(r"[^A-Za-z0-9]", "", self._call_id_prefix).removeprefix("call")
        return (unique + "0" * width)[: width - len(str(index))] + str(index)

    def _unparsed(self, raw: str) -> list[ReplyEvent]:
        self._flag(UNPARSED_TOOL_CALL)
        out = self._content.push(raw)
        self._content.end_segment()
        return [ContentDelta(out)] if out else []

    def _flag(self, flag: str) -> None:
        if flag not in self._flags:
            self._flags.append(flag)


HARMONY_END = ("<|end|>", "<|call|>", "<|return|>")
_RECIPIENT = re.compile(r"\bto=(\S+?)(?=<\||\s|$)")
_CHANNEL = re.compile(r"<\|channel\|>\s*(\w+)")


class HarmonyParser(ReplyParser):
    """gpt-oss's harmony format: messages `[<|start|>assistant][ to=R]<|channel|>C[ to=R][ <|constrain|>json]
    <|message|>BODY<|end|>` (the first one's `<|start|>assistant` is the generation prompt's; the last one ends at
    <|call|> or <|return|>, stop tokens that never reach the text). Channel analysis is reasoning, final and
    commentary content, and a message to `functions.NAME` (or any recipient) a call with BODY as its JSON."""

    def __init__(self, *, call_id_prefix: str = "call_") -> None:
        super().__init__(None, None, call_id_prefix=call_id_prefix)
        self._mode = "header"
        self._recipient: str | None = None
        self._header = ""

    def feed(self, text_delta: str) -> list[ReplyEvent]:
        if self._finished:
            raise RuntimeError("feed() after finish()")
        self._buf += text_delta
        events: list[ReplyEvent] = []
        while True:
            if self._mode == "header":
                head, tag, rest = self._buf.partition("<|message|>")
                if not tag:
                    return events
                self._begin(head)
                self._buf = rest
                continue
            hits = [(self._buf.find(t), t) for t in HARMONY_END]
            hits = [(pos, t) for pos, t in hits if pos >= 0]
            if not hits:
                if self._recipient is None:
                    keep = _partial_tag_len(self._buf, HARMONY_END)
                    ready, self._buf = self._buf[: len(self._buf) - keep], self._buf[len(self._buf) - keep:]
                    events += self._text(ready)
                return events
            pos, tag = min(hits)
            body, self._buf = self._buf[:pos], self._buf[pos + len(tag):]
            events += self._end(body)

    def finish(self) -> list[ReplyEvent]:
        if self._finished:
            return []
        rest, self._buf = self._buf, ""
        if self._mode == "header":  # no <|message|>: whatever came is not harmony, keep it as text
            self._mode = "content"
            events = self._unparsed(rest) if rest.strip() else []
        else:
            events = self._end(rest)
        self._content.end_segment()
        self._reasoning.end_segment()
        self._finished = True
        return events

    def _begin(self, header: str) -> None:
        self._header = header
        channel = _CHANNEL.search(header)
        to = _RECIPIENT.search(header)
        self._recipient = to.group(1) if to else None
        self._mode = "reasoning" if channel and channel.group(1) == "analysis" and not to else "content"

    def _end(self, body: str) -> list[ReplyEvent]:
        if self._recipient is not None:
            args = json_object(body.strip())
            name = self._recipient.removeprefix("functions.")
            events = [self._call(name, args)] if args is not None and name else \
                self._unparsed(self._header + "<|message|>" + body)
        else:
            events = self._text(body)
        self._content.end_segment()
        self._reasoning.end_segment()
        self._mode, self._recipient, self._header = "header", None, ""
        return events


def new_parser(
    tool_parser: str | None = "hermes",
    reasoning_parser: str | None = "think",
    *,
    starts_in_reasoning: bool = False,
    call_id_prefix: str = "call_",
) -> ReplyParser:
    """The parser for a model's reply format: harmony's own, or the tag-driven one."""
    if tool_parser == "harmony" or reasoning_parser == "harmony":
        if tool_parser != "harmony" or reasoning_parser not in ("harmony", None, "none"):
            raise ValueError("harmony is both the tool and the reasoning format: pass --tool-parser harmony with "
                             "--reasoning-parser harmony (or none)")
        return HarmonyParser(call_id_prefix=call_id_prefix)
    return ReplyParser(tool_parser, reasoning_parser, starts_in_reasoning=starts_in_reasoning,
                       call_id_prefix=call_id_prefix)


def parse_reply(
    text: str,
    tool_parser: str | None = "hermes",
    reasoning_parser: str | None = "think",
    *,
    starts_in_reasoning: bool = False,
    call_id_prefix: str = "call_",
) -> ParsedReply:
    """The whole reply at once (the non-streamed path): feed everything, then finish."""
    parser = new_parser(tool_parser, reasoning_parser, starts_in_reasoning=starts_in_reasoning,
                        call_id_prefix=call_id_prefix)
    parser.feed(text)
    parser.finish()
    return parser.result()


def finish_reason(engine_finish_reason: str, reply: ParsedReply) -> str:
    """Completion.finish_reason from the engine's reason and the parsed reply."""
    if engine_finish_reason == "length":
        return "length"
    return "tool_calls" if reply.tool_calls else "stop"
