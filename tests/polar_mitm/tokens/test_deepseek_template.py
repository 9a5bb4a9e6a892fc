"""Polar's DeepSeek V3 template (polar_mitm/tokens/templates/deepseek_v3_tools.jinja) against DeepSeek V3's own
published template (the real tokenizer's, fetched at setup): the same text wherever V3's is right, and with tools
a tools section in the system prompt; the proxy renders a V3 tokenizer with it, and R1's and V3.1's keep theirs."""
from __future__ import annotations

import json

import pytest
from transformers import AutoTokenizer

from polar_mitm.tokens.family import OWN_TEMPLATES, detect
from polar_mitm.tokens.model import load_model
from tests.polar_mitm.tokens.test_reply_families import TOKENIZERS
from polar_serve.prompt_view import parse_prompt
from polar_serve.reply_formats import write_reply

DEEPSEEK = TOKENIZERS / "deepseek_v3"
POLARS = OWN_TEMPLATES["DeepSeek V3/R1"]


@pytest.fixture(scope="module")
def tokenizer():
    assert (DEEPSEEK / ".installed").is_file(), f"{DEEPSEEK}: run `make setup` (scripts/fetch_tokenizers.sh)"
    return AutoTokenizer.from_pretrained(str(DEEPSEEK))


def render(tokenizer, messages, tools=None, gen=True) -> str:
    return tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=gen,
                                         chat_template=POLARS.read_text())


def deepseeks_own(tokenizer, messages, gen=True) -> str:
    """V3's template in transformers' own template environment, given the messages as they are: apply_chat_template
    drops a null `content`, which V3's template needs to write calls at all."""
    from transformers.utils.chat_template_utils import _compile_jinja_template

    return _compile_jinja_template(tokenizer.chat_template).render(
        messages=messages, bos_token=tokenizer.bos_token, add_generation_prompt=gen)


def call(id_: str, command: str) -> dict:
    return {"id": id_, "type": "function", "function": {"name": "bash", "arguments": json.dumps({"command": command})}}


ASK = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "list, then count"}]
TWO_CALLS = {"role": "assistant", "content": None, "tool_calls": [call("a", "ls"), call("b", "wc -l *")]}
RESULTS = [{"role": "tool", "tool_call_id": "a", "content": "x.txt"},
           {"role": "tool", "tool_call_id": "b", "content": "3 x.txt"}]


@pytest.mark.parametrize("messages", [
    ASK, ASK[1:], ASK + [{"role": "assistant", "content": "Done."}, {"role": "user", "content": "thanks"}],
    ASK + [{"role": "system", "content": "a later note"}],  # hoisted into the system prompt, as V3 does
    ASK + [TWO_CALLS] + RESULTS, ASK + [TWO_CALLS] + RESULTS + [{"role": "assistant", "content": "One file."}],
], ids=["ask", "no-system", "chat", "later-system", "two-calls-results", "and-the-answer"])
def test_without_tools_it_writes_what_deepseeks_own_writes(tokenizer, messages):
    for gen in (True, False):
        assert render(tokenizer, messages, gen=gen) == deepseeks_own(tokenizer, messages, gen)


def test_with_tools_a_session_is_an_append_of_what_the_model_wrote(tokenizer):
    """The tools in the system prompt; each later prompt is the one before, what the model wrote (the reference
    server's `deepseek_v3` format, ended by <｜end▁of▁sentence｜>) and the new results: one merged chain."""
    tools = [{"type": "function", "function": {"name": "bash", "description": "Run a command",
                                               "parameters": {"type": "object", "properties": {
                                                   "command": {"type": "string"}}}}}]
    first = render(tokenizer, ASK, tools)
    assert first.startswith("<｜begin▁of▁sentence｜>Be brief.\n\n## Tools\nYou have access to the following tools:\n"
                            "\n### bash\nDescription: Run a command\n\nParameters: {\"type\": \"object\"")
    assert first.endswith("<｜User｜>list, then count<｜Assistant｜>")
    written = write_reply("deepseek_v3", None, "", [("bash", {"command": "ls"}), ("bash", {"command": "wc -l *"})])
    one_more = write_reply("deepseek_v3", None, "", [("bash", {"command": "pwd"})])
    session = ASK + [TWO_CALLS] + RESULTS
    second = render(tokenizer, session, tools)
    assert second.startswith(first + written + "<｜end▁of▁sentence｜>")
    assert second.endswith("<｜tool▁outputs▁end｜>")  # the model writes on from there, as after V3's own
    third = render(tokenizer, session + [{"role": "assistant", "content": "", "tool_calls": [call("c", "pwd")]},
                                         {"role": "tool", "tool_call_id": "c", "content": "/w"}], tools)
    assert third.startswith(second + one_more + "<｜end▁of▁sentence｜>")
    assert third.endswith("<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>/w<｜tool▁output▁end｜><｜tool▁outputs▁end｜>")
    view = parse_prompt(third)  # what the reference server's policies see of it
    assert view.tools == ("bash",) and view.system == "Be brief." and view.last_user == "list, then count"
    assert view.tool_results == 3 and view.after_tool_result and view.assistant_turns == 2


def test_the_proxy_renders_v3_with_it_and_keeps_r1s_and_v31s(tokenizer):
    model = load_model(str(DEEPSEEK))
    assert (model.tool_parser, model.family) == ("deepseek_v3", "DeepSeek V3/R1; tools rendered by Polar's "
                                                                "deepseek_v3_tools.jinja")
    assert detect(tokenizer.chat_template).template == POLARS
    r1 = tokenizer.chat_template + "{% if add_generation_prompt %}<think>\n{% endif %}"
    v31 = tokenizer.chat_template + "{% if tools %}## Tools{% endif %}"
    assert detect(r1).template is None and detect(r1).reasoning_parser == "think"
    assert detect(v31).template is None and detect(v31).tool_parser == "deepseek_v3"
