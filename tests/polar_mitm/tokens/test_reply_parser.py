"""Reply parsing: reasoning, content and tool calls, streamed and not, identical either way."""
from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from polar_mitm.conversation import ContentDelta, ReasoningDelta, ToolCall, ToolCallDone
from polar_mitm.tokens.reply_parser import (
    UNCLOSED_REASONING,
    UNPARSED_TOOL_CALL,
    ParsedReply,
    ReplyParser,
    finish_reason,
    new_parser,
    parse_reply,
)

HERMES_TWO_CALLS = (
    "<think>\nThe user wants the tests run.\n</think>\n\nRunning them now.\n"
    '<tool_call>\n{"name": "bash", "arguments": {"command": "pytest -q"}}\n</tool_call>\n'
    '<tool_call>\n{"name": "read", "arguments": {"path": "ü.py", "limit": 5}}\n</tool_call>'
)

QWEN3_CODER_CALL = (
    "I'll write the file.\n<tool_call>\n<function=write_file>\n<parameter=path>\n/work/a.py\n</parameter>\n"
    "<parameter=content>\ndef add(a, b):\n    return a + b\n\n</parameter>\n<parameter=mode>\n420\n</parameter>\n"
    '<parameter=flags>\n["x", 1]\n</parameter>\n<parameter=quoted>\n"7"\n</parameter>\n</function>\n</tool_call>'
)


def stream(text: str, cuts: list[int], **kw) -> tuple[list, ParsedReply]:
    parser = ReplyParser(**kw)
    events, start = [], 0
    for cut in sorted(set(cuts)) + [len(text)]:
        events += parser.feed(text[start:cut])
        start = cut
    events += parser.finish()
    return events, parser.result()


def replay(events: list) -> tuple[str, str, tuple[ToolCall, ...]]:
    content = "".join(e.text for e in events if isinstance(e, ContentDelta))
    reasoning = "".join(e.text for e in events if isinstance(e, ReasoningDelta))
    calls = tuple(e.call for e in events if isinstance(e, ToolCallDone))
    return content, reasoning, calls


def test_hermes_reasoning_content_and_two_calls():
    reply = parse_reply(HERMES_TWO_CALLS, call_id_prefix="call_ab_")
    assert reply.reasoning == "The user wants the tests run."
    assert reply.content == "Running them now."
    assert reply.tool_calls == (
        ToolCall("call_ab_0", "bash", '{"command": "pytest -q"}'),
        ToolCall("call_ab_1", "read", '{"path": "ü.py", "limit": 5}'),
    )
    assert reply.flags == ()


def test_hermes_accepts_arguments_as_json_text_and_missing_arguments():
    text = ('<tool_call>{"name": "a", "arguments": "{\\"x\\": 1}"}</tool_call>'
            '<tool_call>{"name": "b"}</tool_call>')
    assert [c.arguments for c in parse_reply(text).tool_calls] == ['{"x": 1}', "{}"]


def test_qwen3_coder_values_are_json_decoded_when_valid():
    reply = parse_reply(QWEN3_CODER_CALL, tool_parser="qwen3_coder")
    assert reply.content == "I'll write the file."
    (call,) = reply.tool_calls
    assert call.name == "write_file"
    assert call.args() == {
        "path": "/work/a.py",
        "content": "def add(a, b):\n    return a + b\n",
        "mode": 420,
        "flags": ["x", 1],
        "quoted": "7",
    }
    assert parse_reply(QWEN3_CODER_CALL, tool_parser="qwen3-coder") == reply


def test_reply_that_starts_inside_reasoning():
    reply = parse_reply("plan: run tests\n</think>\n\nDone.", starts_in_reasoning=True)
    assert (reply.reasoning, reply.content, reply.flags) == ("plan: run tests", "Done.", ())


def test_reasoning_cut_by_length_is_flagged():
    reply = parse_reply("<think>\nstill going", "hermes")
    assert (reply.reasoning, reply.content, reply.flags) == ("still going", "", (UNCLOSED_REASONING,))


@pytest.mark.parametrize(
    "text, tool_parser",
    [
        ("Before\n<tool_call>\n{not json}\n</tool_call>", "hermes"),
        ('Before\n<tool_call>\n{"arguments": {}}\n</tool_call>', "hermes"),
        ('Before\n<tool_call>\n{"name": "x", "arguments": [1]}\n</tool_call>', "hermes"),
        ("Before\n<tool_call>\n<function=f>\nstray text\n</function>\n</tool_call>", "qwen3_coder"),
        ("Before\n<tool_call>\n<parameter=a>\n1\n</parameter>\n</tool_call>", "qwen3_coder"),
    ],
)
def test_unparseable_call_is_content_and_flagged(text, tool_parser):
    reply = parse_reply(text, tool_parser)
    assert reply.tool_calls == ()
    assert reply.flags == (UNPARSED_TOOL_CALL,)
    body = text[text.index("<tool_call>"):]
    assert reply.content == "Before\n" + body


def test_unclosed_call_at_the_end_is_content_and_flagged():
    reply = parse_reply('Calling.\n<tool_call>\n{"name": "bash", "argum')
    assert reply.content == 'Calling.\n<tool_call>\n{"name": "bash", "argum'
    assert reply.flags == (UNPARSED_TOOL_CALL,)


def test_partial_tags_are_held_back_while_streaming():
    parser = ReplyParser()
    seen = []
    for ch in 'Hi <tool_call>{"name": "f", "arguments": {}}</tool_call> a < b <th':
        seen += parser.feed(ch)
    assert "".join(e.text for e in seen if isinstance(e, ContentDelta)) == "Hi\na < b"
    assert [e.call.name for e in seen if isinstance(e, ToolCallDone)] == ["f"]
    assert parser.finish() == [ContentDelta(" <th")]
    assert parser.result().content == "Hi\na < b <th"


def test_parsers_can_be_switched_off():
    text = '<think>x</think><tool_call>{"name": "f"}</tool_call>'
    assert parse_reply(text, tool_parser=None, reasoning_parser=None).content == text
    assert parse_reply(text, tool_parser=None).content == '<tool_call>{"name": "f"}</tool_call>'


def test_whitespace_is_trimmed_around_tags_and_segments_join_with_newline():
    text = '\n\n  A  \n<tool_call>{"name": "f"}</tool_call>\n\n B \n<think> r1 </think><think>r2</think>'
    reply = parse_reply(text)
    assert (reply.content, reply.reasoning) == ("A\nB", "r1\nr2")


def test_unknown_parsers_are_refused():
    with pytest.raises(ValueError, match="tool parser"):
        ReplyParser("mistral_v99")
    with pytest.raises(ValueError, match="reasoning parser"):
        ReplyParser(reasoning_parser="harmony")  # harmony's parser is HarmonyParser (new_parser picks it)
    with pytest.raises(ValueError, match="both"):
        new_parser("hermes", "harmony")
    with pytest.raises(ValueError):
        ReplyParser(reasoning_parser=None, starts_in_reasoning=True)


def test_feed_after_finish_is_an_error():
    parser = ReplyParser()
    parser.finish()
    with pytest.raises(RuntimeError):
        parser.feed("x")


def test_finish_reason():
    with_call = parse_reply('<tool_call>{"name": "f"}</tool_call>')
    assert finish_reason("stop", with_call) == "tool_calls"
    assert finish_reason("length", with_call) == "length"
    assert finish_reason("stop", parse_reply("hi")) == "stop"


def test_long_tool_call_streamed_token_by_token():
    args = {"content": "x" * 20000}
    text = "<tool_call>\n" + json.dumps({"name": "write", "arguments": args}) + "\n</tool_call>"
    events, reply = stream(text, list(range(0, len(text), 2)))
    assert reply.tool_calls[0].args() == args
    assert events == [ToolCallDone(0, reply.tool_calls[0])]


FRAGMENTS = [
    "<think>", "</think>", "<tool_call>", "</tool_call>", "\n", " ", "  \n", "hello", "wörld", "<", "<th",
    "</", "<tool", "{bad", '{"name": "f", "arguments": {"a": 1}}', '{"name": "g"}',
    "<function=g>\n<parameter=x>\n5\n</parameter>\n</function>", "<parameter=y>\nv\n</parameter>",
]


@settings(max_examples=300, deadline=None)
@given(
    pieces=st.lists(st.sampled_from(FRAGMENTS), max_size=14),
    cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=12),
    tool_parser=st.sampled_from(["hermes", "qwen3_coder", None]),
    starts_in_reasoning=st.booleans(),
)
def test_streamed_equals_non_streamed(pieces, cuts, tool_parser, starts_in_reasoning):
    text = "".join(pieces)
    kw = {"tool_parser": tool_parser, "starts_in_reasoning": starts_in_reasoning}
    whole = parse_reply(text, **kw)
    events, streamed = stream(text, [c for c in cuts if c <= len(text)], **kw)
    one_shot, _ = stream(text, [], **kw)
    assert streamed == whole
    content, reasoning, calls = replay(events)
    assert (content, reasoning or None, calls) == (whole.content, whole.reasoning, whole.tool_calls)
    assert replay(one_shot) == (content, reasoning, calls)
    assert [e.index for e in events if isinstance(e, ToolCallDone)] == list(range(len(calls)))
