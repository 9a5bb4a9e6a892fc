"""Polar's Llama 3.1 template (polar_mitm/tokens/templates/llama3_tools.jinja) against Meta's own chat format,
llama-models (tests/llama_reference.py): the Llama 3.1 vocabulary llama-models ships, converted to a Hugging Face
tokenizer, has no chat template; the proxy renders it with Polar's, and each conversation here must be the very
ids llama-models encodes. The tools: the harnesses' recorded ones (fixtures/requests)."""
from __future__ import annotations

import json

import pytest
from transformers import AutoTokenizer

from polar_mitm.tokens.family import TEMPLATES
from polar_mitm.tokens.model import load_model
from tests.llama_reference import llama_models, write_hf_tokenizer
from tests.polar_mitm.tokens.test_harmony_template import SESSION, SHELL, call, recorded_tools

TEMPLATE = TEMPLATES / "llama3_tools.jinja"


@pytest.fixture(scope="module")
def llama31(tmp_path_factory):
    return write_hf_tokenizer(tmp_path_factory.mktemp("llama31") / "hf")


def assert_same(folder, chats: list[tuple[list[dict], list[dict] | None]]) -> None:
    """Each (messages, tools): Polar's template's ids are llama-models' (one oracle run for them all)."""
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    tokenizer.chat_template = TEMPLATE.read_text()
    wants = llama_models([{"messages": m, "tools": t} for m, t in chats])
    for (messages, tools), want in zip(chats, wants):
        text = tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False)
        got = tokenizer.encode(text, add_special_tokens=False)
        if got != want:
            expected = tokenizer.decode(want)
            at = next((i for i, (a, b) in enumerate(zip(text, expected)) if a != b), min(len(text), len(expected)))
            near = slice(max(0, at - 80), at + 80)
            raise AssertionError(f"differs at {at}: ours {text[near]!r}, llama-models {expected[near]!r}")


def test_every_prefix_of_a_tool_session_is_llama_models_encoding(llama31):
    """Two calls in a turn (arguments as text and as an object), results, an answer, a user turn given as parts,
    a later system message; with tools and without, with a system message and without."""
    unicode_call = {"id": "c9", "type": "function", "function": {"name": "bash", "arguments": {"command": "echo é 日"}}}
    session = [*SESSION[:-2], {"role": "assistant", "content": "", "tool_calls": [unicode_call]},
               {"role": "tool", "tool_call_id": "c9", "content": "é 日\n"}, *SESSION[-2:]]
    chats = [(session[:upto], tools) for upto in range(2, len(session) + 1) for tools in (SHELL, None)]
    chats += [(session[1:4], SHELL), (session[1:2], None), ([{"role": "system", "content": ""}, session[1]], SHELL)]
    assert_same(llama31, chats)


@pytest.mark.parametrize("recorded", ["opencode_chat_turn2.json", "qwen_chat_turn2.json",
                                      "claude_anthropic_turn2.json"])
def test_the_harnesses_tools_are_written_as_llama_models_writes_them(llama31, recorded):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"},
                {"role": "assistant", "content": "Looking.", "tool_calls": [call("c1", "ls")]},
                {"role": "tool", "tool_call_id": "c1", "content": "a.txt"}]
    assert_same(llama31, [(messages, recorded_tools(recorded))])


def test_the_proxy_renders_a_template_less_llama31_vocabulary_with_it(llama31):
    model = load_model(str(llama31))
    assert (model.tool_parser, model.reasoning_parser) == ("llama3_json", None)
    assert "Polar's llama3_tools.jinja renders" in model.family
    assert model.tokenizer.chat_template == TEMPLATE.read_text()
    ids = [model.tokenizer.convert_tokens_to_ids(t) for t in ("<|eot_id|>", "<|eom_id|>", "<|end_of_text|>")]
    assert set(ids[:1]) <= model.stop_ids, (ids, model.stop_ids)


def test_a_reply_written_as_llama_models_writes_calls_parses_back(llama31):
    """What the reference server's `llama_models` format writes (two calls, one after the other; after text,
    behind <|python_tag|>) is two calls, and alone it is what the template renders for them."""
    from polar_mitm.tokens.reply_parser import parse_reply
    from polar_serve.reply_formats import write_reply

    text = write_reply("llama_models", None, "Two.", [("bash", {"command": "ls"}), ("bash", '{"command": "pwd é"}')])
    calls = ('{"type": "function", "name": "bash", "parameters": {"command": "ls"}}'
             '{"type": "function", "name": "bash", "parameters": {"command": "pwd é"}}')
    assert text == "Two.<|python_tag|>" + calls
    reply = parse_reply(text, "llama3_json", None)
    assert reply.content == "Two." and [(c.name, json.loads(c.arguments)) for c in reply.tool_calls] == [
        ("bash", {"command": "ls"}), ("bash", {"command": "pwd é"})]
    alone = write_reply("llama_models", None, "", [("bash", {"command": "ls é"})])
    assert [c.name for c in parse_reply(alone, "llama3_json", None).tool_calls] == ["bash"]
    tokenizer = AutoTokenizer.from_pretrained(str(llama31))
    tokenizer.chat_template = TEMPLATE.read_text()
    turn = [{"role": "assistant", "content": "", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "bash", "arguments": {"command": "ls é"}}}]}]
    assert tokenizer.apply_chat_template(turn, tokenize=False).endswith(
        f"<|start_header_id|>assistant<|end_header_id|>\n\n{alone}<|eot_id|>")
