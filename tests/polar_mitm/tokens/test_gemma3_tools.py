"""Gemma 3's prompt-based tool calls (issue 45): Gemma 3's own template renders no tools, so the proxy renders
with Polar's (polar_mitm/tokens/templates/gemma3_tools.jinja). Without tools it writes exactly what Gemma's
own writes; with them, the tools and past calls in the ```tool_code form, which a reply in that form (as the
reference server writes it) parses back from, through the real Gemma 3 tokenizer."""
from __future__ import annotations

import pytest
from jinja2.exceptions import TemplateError

from polar_mitm.tokens.family import OWN_TEMPLATES, detect
from polar_mitm.tokens.model import load_model
from polar_serve.reply_formats import write_reply
from tests.polar_mitm.tokens.test_reply_families import (BASH, READ, TOKENIZERS, TWO_CALLS, real_tokenizer,
                                                         rendered_reply, stream_ids)

POLARS = OWN_TEMPLATES["Gemma 3"].read_text()
TOOLS = [{"type": "function", "function": {"name": n, "description": f"{n} it", "parameters": {
    "type": "object", "properties": {k: {"type": "string"} for k in a}}}} for n, a in TWO_CALLS]


@pytest.fixture(scope="module")
def gemma():
    return real_tokenizer("gemma3")


def polars(tokenizer, messages, tools=None, generation_prompt=False) -> str:
    return tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, chat_template=POLARS,
                                         add_generation_prompt=generation_prompt)


def calls_of(named_args) -> list[dict]:
    return [{"id": f"c{i}", "type": "function", "function": {"name": n, "arguments": a}}
            for i, (n, a) in enumerate(named_args)]


CHATS = [
    [{"role": "user", "content": "hi  "}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"},
     {"role": "assistant", "content": " yo\n"}, {"role": "user", "content": "more"}],
    [{"role": "system", "content": [{"type": "text", "text": "S"}]},
     {"role": "user", "content": [{"type": "text", "text": "a "}, {"type": "image"}, {"type": "text", "text": "b"}]}],
]


@pytest.mark.parametrize("chat", CHATS)
@pytest.mark.parametrize("generation_prompt", [False, True])
def test_without_tools_it_renders_what_gemmas_own_renders(gemma, chat, generation_prompt):
    own = gemma.apply_chat_template(chat, tokenize=False, add_generation_prompt=generation_prompt)
    assert polars(gemma, chat, generation_prompt=generation_prompt) == own


@pytest.mark.parametrize("chat", [[{"role": "user", "content": "a"}, {"role": "user", "content": "b"}],
                                  [{"role": "assistant", "content": "a"}]])
def test_it_refuses_the_role_orders_gemmas_own_refuses(gemma, chat):
    for template in (None, POLARS):
        with pytest.raises(TemplateError, match="roles must alternate"):
            gemma.apply_chat_template(chat, tokenize=False, chat_template=template)


def test_tools_calls_and_results_are_in_the_prompt(gemma):
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "list and read"},
            {"role": "assistant", "content": "Let me look.", "tool_calls": calls_of(TWO_CALLS)},
            {"role": "tool", "tool_call_id": "c0", "content": "a.py"},
            {"role": "tool", "tool_call_id": "c1", "content": "x = 1"}]
    text = polars(gemma, chat, TOOLS, generation_prompt=True)
    head, _, rest = text.partition("list and read")
    assert head.startswith("<bos><start_of_turn>user\nBe brief.\n\n") and "```tool_code" in head
    assert all(f'"name": "{name}"' in head for name, _a in TWO_CALLS)  # each tool's schema, as JSON
    assert rest == ('<end_of_turn>\n<start_of_turn>model\nLet me look.\n```tool_code\n'
                    'bash(command="ls -la", timeout=30)\nread(path="ü.py", lines=[1, 2])\n```<end_of_turn>\n'
                    '<start_of_turn>user\n```tool_output\na.py\n```\n```tool_output\nx = 1\n```<end_of_turn>\n'
                    '<start_of_turn>model\n')  # the two results: one user turn, so the roles still alternate


def test_a_user_note_after_tool_results_joins_their_turn(gemma):
    """Claude Code sends a reminder beside the results: one user turn still, so Gemma's roles alternate."""
    chat = [{"role": "user", "content": "list"}, {"role": "assistant", "content": "", "tool_calls": calls_of(
        TWO_CALLS[:1])}, {"role": "tool", "tool_call_id": "c0", "content": "a.py"}, {"role": "user", "content": "Go on."}]
    assert polars(gemma, chat, TOOLS, generation_prompt=True).endswith(
        '<start_of_turn>user\n```tool_output\na.py\n```\nGo on.<end_of_turn>\n<start_of_turn>model\n')


@pytest.mark.parametrize("content", ["Let me look.", ""])
def test_a_past_call_is_rendered_as_the_model_writes_it_and_parses_back(content):
    chat = [{"role": "user", "content": "list and read"},
            {"role": "assistant", "content": content, "tool_calls": calls_of(TWO_CALLS)}]
    gemma = real_tokenizer("gemma3")
    gemma.chat_template = POLARS
    text = rendered_reply(gemma, chat, "<end_of_turn>")
    assert text == write_reply("tool_code", None, content, TWO_CALLS)  # the history is an append of the reply
    ids, reply = stream_ids(gemma, text, "tool_code", None)
    assert (reply.content, reply.flags) == (content, ())
    assert [(c.name, c.args()) for c in reply.tool_calls] == [("bash", BASH), ("read", READ)]


def test_the_proxy_reads_gemma3_as_tool_code_with_polars_template(tmp_path):
    formats = detect(real_tokenizer("gemma3").chat_template)
    assert (formats.family, formats.tool_parser, formats.reasoning_parser) == ("Gemma 3", "tool_code", None)
    assert formats.template == OWN_TEMPLATES["Gemma 3"]
    model = load_model(str(TOKENIZERS / "gemma3"))
    assert model.tool_parser == "tool_code" and "gemma3_tools.jinja" in model.family
    assert model.template_drops == frozenset()  # tools, calls and results all reach the model
    assert model.renderer.tokenizer.chat_template == POLARS
    kept = load_model(str(TOKENIZERS / "gemma3"), tool_parser="none")  # a user's way back to Gemma's own
    assert kept.template_drops == {"tools", "tool_calls", "tool_results"}
    assert detect(POLARS).tool_parser == "tool_code"  # Polar's template, saved with a model, reads as itself
