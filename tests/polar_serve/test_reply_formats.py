"""The reference server writes a scripted reply in each family's markup (polar_serve/reply_formats.py), and the
proxy's parser of that family reads back what was written: reasoning, content and every call."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from polar_mitm.tokens.reply_parser import UNPARSED_TOOL_CALL, parse_reply
from polar_serve.reply_formats import REPLY_FORMATS, write_reply

REASONING = {"hermes": "think", "qwen3_coder": "think", "glm45": "think", "deepseek_v3": "think",
             "deepseek_v3_plain": None,
             "kimi_k2": "think", "mistral": "mistral", "mistral_v3": None, "mistral_v11": None, "llama3_json": None,
             "llama_models": None, "harmony": "harmony", "tool_code": None}
# the proxy's one Mistral parser reads all its shapes, its Llama 3 parser both ways of writing a call
PARSER = {"mistral_v3": "mistral", "mistral_v11": "mistral", "llama_models": "llama3_json",
          "deepseek_v3_plain": "deepseek_v3"}

words = st.text(st.characters(whitelist_categories=("L", "N"), whitelist_characters=" .,:;!?-ü"), min_size=1,
                max_size=30).map(str.strip).filter(bool)
names = st.from_regex(r"[a-z][a-z0-9_]{0,11}", fullmatch=True)
# String values that stay strings: an XML-ish format decodes a value that is valid JSON ("30" becomes 30).
values = st.one_of(words.map(lambda w: f"v {w}"), st.integers(-10**6, 10**6), st.booleans(),
                   st.lists(st.integers(0, 9), max_size=3))
calls = st.lists(st.tuples(names, st.dictionaries(names, values, max_size=3)), max_size=3)


@pytest.mark.parametrize("fmt", REPLY_FORMATS)
@settings(max_examples=40, deadline=None)
@given(think=st.none() | words, content=st.just("") | words, written=calls)
def test_what_the_server_writes_the_proxy_reads(fmt, think, content, written):
    reply = parse_reply(write_reply(fmt, think, content, written), PARSER.get(fmt, fmt), REASONING[fmt])
    assert reply.reasoning == (None if REASONING[fmt] is None else think)  # Llama 3, Gemma 3: no reasoning
    assert reply.content == content
    assert [(c.name, c.args()) for c in reply.tool_calls] == written
    assert reply.flags == ()


@pytest.mark.parametrize("fmt", REPLY_FORMATS)
def test_malformed_arguments_are_written_as_given_and_read_as_unparsed(fmt):
    text = write_reply(fmt, None, "", [("bash", '{"command": ')])
    assert '{"command": ' in text
    reply = parse_reply(text, PARSER.get(fmt, fmt), REASONING[fmt])
    if fmt in ("qwen3_coder", "glm45"):  # one string parameter, the text as it was: nothing lost
        assert [c.args() for c in reply.tool_calls] == [{"input": '{"command": '}]
    elif fmt in ("llama3_json", "llama_models"):  # a bare reply that is no JSON call is plain content
        assert (reply.tool_calls, reply.content) == ((), text)
    else:
        assert reply.tool_calls == () and UNPARSED_TOOL_CALL in reply.flags and '{"command":' in reply.content


def test_an_unknown_format_is_refused():
    with pytest.raises(ValueError, match="unknown reply format 'chatml'"):
        write_reply("chatml", None, "hi", [])
