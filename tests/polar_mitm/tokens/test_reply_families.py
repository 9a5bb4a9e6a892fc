"""Each family's tool-call and reasoning format (issue 45): replies written the way that family's models write them
(the formats their chat templates render for past calls) parse into the same calls, streamed in any split; and
through the families' real tokenizers (fetched at setup), replies their own templates render parse back into the
calls rendered (Gemma 3's, with Polar's template: test_gemma3_tools.py). Mistral, Kimi K2 and GLM are checked on
text only: no tokenizer of theirs is fetched yet."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from polar_mitm.conversation import ContentDelta, ReasoningDelta, ToolCallDone
from polar_mitm.tokens.detok import Detokenizer
from polar_mitm.tokens.family import detect
from polar_mitm.tokens.reply_parser import UNPARSED_TOOL_CALL, new_parser, parse_reply

BASH = {"command": "ls -la", "timeout": 30}
READ = {"path": "ü.py", "lines": [1, 2]}
TWO_CALLS = [("bash", BASH), ("read", READ)]


def j(value: object) -> str:
    return json.dumps(value, ensure_ascii=False)


# (tool parser, reasoning parser, reply text, reasoning, content, calls)
REPLIES = {
    "glm45": ("glm45", "think",
              "<think>Need the files.</think>\nLet me look.\n<tool_call>bash\n<arg_key>command</arg_key>\n"
              "<arg_value>ls -la</arg_value>\n<arg_key>timeout</arg_key>\n<arg_value>30</arg_value>\n</tool_call>\n"
              "<tool_call>read\n<arg_key>path</arg_key>\n<arg_value>ü.py</arg_value>\n<arg_key>lines</arg_key>\n"
              "<arg_value>[1, 2]</arg_value>\n</tool_call>",
              "Need the files.", "Let me look.", TWO_CALLS),
    "deepseek_v3": ("deepseek_v3", "think",
                    f"<think>Need the files.</think>Let me look.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function"
                    f"<｜tool▁sep｜>bash\n```json\n{j(BASH)}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function"
                    f"<｜tool▁sep｜>read\n```json\n{j(READ)}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
                    "Need the files.", "Let me look.", TWO_CALLS),
    "deepseek_v3.1": ("deepseek_v3", "think",
                      f"Let me look.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>bash<｜tool▁sep｜>{j(BASH)}"
                      f"<｜tool▁call▁end｜><｜tool▁call▁begin｜>read<｜tool▁sep｜>{j(READ)}<｜tool▁call▁end｜>"
                      "<｜tool▁calls▁end｜>",
                      None, "Let me look.", TWO_CALLS),
    "kimi_k2": ("kimi_k2", "think",
                f"<think>Need the files.</think>Let me look.<|tool_calls_section_begin|><|tool_call_begin|>"
                f"functions.bash:0<|tool_call_argument_begin|>{j(BASH)}<|tool_call_end|><|tool_call_begin|>"
                f"functions.read:1<|tool_call_argument_begin|>{j(READ)}<|tool_call_end|><|tool_calls_section_end|>",
                "Need the files.", "Let me look.", TWO_CALLS),
    "mistral_v3": ("mistral", None,
                   f'Let me look.[TOOL_CALLS] [{{"name": "bash", "arguments": {j(BASH)}, "id": "a1b2c3d4e"}}, '
                   f'{{"name": "read", "arguments": {j(READ)}, "id": "f5g6h7i8j"}}]',
                   None, "Let me look.", TWO_CALLS),
    "mistral_v11": ("mistral", "mistral",
                    f"[THINK]Need the files.[/THINK]Let me look.[TOOL_CALLS]bash[ARGS]{j(BASH)}"
                    f"[TOOL_CALLS]read[CALL_ID]f5g6h7i8j[ARGS]{j(READ)}",
                    "Need the files.", "Let me look.", TWO_CALLS),
    "llama3_json": ("llama3_json", None,
                    f'{{"name": "bash", "parameters": {j(BASH)}}}; {{"name": "read", "parameters": {j(READ)}}}',
                    None, "", TWO_CALLS),
    "llama3_python_tag": ("llama3_json", None,
                          f'Let me look.<|python_tag|>{{"name": "bash", "parameters": {j(BASH)}}}',
                          None, "Let me look.", TWO_CALLS[:1]),
    "harmony_call": ("harmony", "harmony",
                     "<|channel|>analysis<|message|>Need the files.<|end|><|start|>assistant<|channel|>commentary"
                     f"<|message|>Let me look.<|end|><|start|>assistant to=functions.bash<|channel|>commentary "
                     f"<|constrain|>json<|message|>{j(BASH)}",
                     "Need the files.", "Let me look.", TWO_CALLS[:1]),
    "tool_code": ("tool_code", None,
                  'Let me look.\n```tool_code\nbash(command="ls -la", timeout=30)\nread(path="ü.py", lines=[1, 2])\n```',
                  None, "Let me look.", TWO_CALLS),
    "tool_code_python": ("tool_code", None,  # Python's literals and a list of calls, as a model may write them
                         "```tool_code\n[bash(command='ls -la', timeout=30), read(path='ü.py', lines=(1, 2))]\n```",
                         None, "", TWO_CALLS),
    "tool_code_hyphens": ("tool_code", None,  # hyphenated names, keyword names, and text that only looks like them
                          '```tool_code\nweb-search(query="a - b(c=1)", max-results=3, from="x")\n```',
                          None, "", [("web-search", {"query": "a - b(c=1)", "max-results": 3, "from": "x"})]),
    "harmony_final": ("harmony", "harmony",
                      "<|channel|>analysis<|message|>Need the files.<|end|><|start|>assistant<|channel|>final"
                      "<|message|>Here they are.",
                      "Need the files.", "Here they are.", []),
}


@pytest.mark.parametrize("name", REPLIES)
def test_each_familys_reply_parses_into_its_calls(name):
    tools, reasoning, text, thought, content, calls = REPLIES[name]
    reply = parse_reply(text, tools, reasoning, call_id_prefix="call_x_")
    assert (reply.reasoning, reply.content, reply.flags) == (thought, content, ())
    assert [(c.name, c.args()) for c in reply.tool_calls] == calls
    if tools == "mistral":  # the model's own ids where it wrote one, else 9 letters and digits of the proxy's
        assert [c.id for c in reply.tool_calls] == IDS[name]
    else:
        assert [c.id for c in reply.tool_calls] == [f"call_x_{i}" for i in range(len(calls))]


IDS = {"mistral_v3": ["a1b2c3d4e", "f5g6h7i8j"], "mistral_v11": ["x00000000", "f5g6h7i8j"]}


@settings(max_examples=60, deadline=None)
@given(name=st.sampled_from(sorted(REPLIES)), data=st.data())
def test_any_split_streams_the_same_reply(name, data):
    tools, reasoning, text, *_ = REPLIES[name]
    cuts = sorted(set(data.draw(st.lists(st.integers(0, len(text)), max_size=12))))
    parser = new_parser(tools, reasoning)
    events, start = [], 0
    for cut in cuts + [len(text)]:
        events += parser.feed(text[start:cut])
        start = cut
    events += parser.finish()
    whole = parse_reply(text, tools, reasoning)
    assert parser.result() == whole
    assert "".join(e.text for e in events if isinstance(e, ContentDelta)) == whole.content
    assert "".join(e.text for e in events if isinstance(e, ReasoningDelta)) == (whole.reasoning or "")
    assert tuple(e.call for e in events if isinstance(e, ToolCallDone)) == whole.tool_calls


@pytest.mark.parametrize("tools, text, kept", [
    ("mistral", "Sure.[TOOL_CALLS]not a call", "Sure.\n[TOOL_CALLS]not a call"),
    ("mistral", '[TOOL_CALLS][{"name": "a", "arguments": {}}, 3]', '[TOOL_CALLS][{"name": "a", "arguments": {}}, 3]'),
    ("deepseek_v3", "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>bash\n```json\n{oops\n```"
                    "<｜tool▁call▁end｜>",
     "<｜tool▁call▁begin｜>function<｜tool▁sep｜>bash\n```json\n{oops\n```<｜tool▁call▁end｜>"),
    ("kimi_k2", '<|tool_call_begin|>functions.bash:0<|tool_call_argument_begin|>{"a": 1}',  # never closed
     '<|tool_call_begin|>functions.bash:0<|tool_call_argument_begin|>{"a": 1}'),
    ("glm45", "<tool_call>bash\n<arg_key>a</arg_key>stray<arg_value>1</arg_value></tool_call>",
     "<tool_call>bash\n<arg_key>a</arg_key>stray<arg_value>1</arg_value></tool_call>"),
    ("llama3_json", 'Sure.<|python_tag|>{"name": "a", "parameters": 3}',
     'Sure.\n<|python_tag|>{"name": "a", "parameters": 3}'),
    ("tool_code", "Sure.\n```tool_code\n__import__(name='os').system(command='x')\n```",  # never run, never read
     "Sure.\n```tool_code\n__import__(name='os').system(command='x')\n```"),
    ("tool_code", "```tool_code\nbash('ls')\n```", "```tool_code\nbash('ls')\n```"),  # positional: no names
    ("tool_code", "```tool_code\nweb - search(q=1)\n```", "```tool_code\nweb - search(q=1)\n```"),  # a subtraction
    ("tool_code", "```tool_code\nbash(command=ls)\n", "```tool_code\nbash(command=ls)"),  # a name, never closed
    ("harmony", "<|channel|>commentary to=functions.bash <|constrain|>json<|message|>{not json",
     "<|channel|>commentary to=functions.bash <|constrain|>json<|message|>{not json"),
])
def test_a_call_that_does_not_parse_stays_as_text_and_is_flagged(tools, text, kept):
    reply = parse_reply(text, tools, "harmony" if tools == "harmony" else None)
    assert (reply.content, reply.tool_calls, reply.flags) == (kept, (), (UNPARSED_TOOL_CALL,))


def test_a_llama_reply_that_is_json_but_no_call_is_plain_content():
    reply = parse_reply('  {"answer": 42}', "llama3_json", None)
    assert (reply.content, reply.tool_calls, reply.flags) == ('{"answer": 42}', (), ())
    assert parse_reply("The answer is {42}.", "llama3_json", None).content == "The answer is {42}."


def test_text_before_harmony_headers_is_kept():
    reply = parse_reply("plain text, no channel", "harmony", "harmony")
    assert reply.content == "plain text, no channel" and reply.flags == (UNPARSED_TOOL_CALL,)


# ---------------------------------------------------------------- real tokenizers (scripts/fetch_tokenizers.sh)

TOKENIZERS = Path(__file__).resolve().parents[3] / ".tools" / "tokenizers"


def real_tokenizer(family: str):
    from transformers import AutoTokenizer

    path = TOKENIZERS / family
    assert (path / ".installed").is_file(), f"{path}: no tokenizer; run `make setup` (scripts/fetch_tokenizers.sh)"
    return AutoTokenizer.from_pretrained(str(path))


def stream_ids(tokenizer, text: str, tools: str, reasoning: str | None, starts_in_reasoning: bool = False):
    """The reply as the proxy meets it: the ids the model would sample, one at a time, through the detokenizer."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.decode(ids, skip_special_tokens=False) == text  # the ids stand for exactly this text
    detok, parser = Detokenizer(tokenizer), new_parser(tools, reasoning, starts_in_reasoning=starts_in_reasoning)
    for i in ids:
        parser.feed(detok.feed([i]))
    parser.feed(detok.flush())
    parser.finish()
    return ids, parser.result()


@pytest.mark.parametrize("family, read_as", [
    ("qwen3", ("Qwen/Hermes", "hermes", "think")),
    ("deepseek_v3", ("DeepSeek V3/R1", "deepseek_v3", None)),
    ("llama3_1", ("no tool calls in the template", None, None)),  # this package's template renders no tools
    ("gemma3", ("Gemma 3", "tool_code", None)),  # with Polar's template (test_gemma3_tools.py)
])
def test_each_real_template_reads_as_its_family(family, read_as):
    formats = detect(real_tokenizer(family).chat_template)
    assert (formats.family, formats.tool_parser, formats.reasoning_parser) == read_as


def rendered_reply(tokenizer, messages: list[dict], end: str, raw: bool = False) -> str:
    """What the template renders for the last (assistant) message: the text a model of the family samples.
    raw: render the template as jinja, as HF did before it dropped keys whose value is None (DeepSeek V3's
    template writes tool calls only for `content is none`)."""
    if raw:
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        template = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True).from_string(
            tokenizer.chat_template)

        def render(chat: list[dict], generation_prompt: bool = False) -> str:
            return template.render(messages=chat, add_generation_prompt=generation_prompt,
                                   bos_token=tokenizer.bos_token, eos_token=tokenizer.eos_token)
    else:
        def render(chat: list[dict], generation_prompt: bool = False) -> str:
            return tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=generation_prompt)
    prompt, whole = render(messages[:-1], True), render(messages)
    assert whole.startswith(prompt)
    reply = whole[len(prompt):].rstrip("\n")
    assert reply.endswith(end)
    return reply[: -len(end)]  # the end-of-turn token is a stop id: never text


def test_qwen3s_own_rendering_of_reasoning_and_two_calls_parses_back():
    tokenizer = real_tokenizer("qwen3")
    calls = [{"type": "function", "function": {"name": n, "arguments": a}} for n, a in TWO_CALLS]
    messages = [{"role": "user", "content": "list and read"},
                {"role": "assistant", "content": "Let me look.", "reasoning_content": "Need the files.",
                 "tool_calls": calls}]
    text = rendered_reply(tokenizer, messages, "<|im_end|>")
    ids, reply = stream_ids(tokenizer, text, "hermes", "think")
    assert tokenizer.convert_tokens_to_ids("<tool_call>") in ids
    assert (reply.reasoning, reply.content, reply.flags) == ("Need the files.", "Let me look.", ())
    assert [(c.name, c.args()) for c in reply.tool_calls] == TWO_CALLS


def test_deepseek_v3s_own_rendering_of_two_calls_parses_back():
    tokenizer = real_tokenizer("deepseek_v3")
    calls = [{"type": "function", "function": {"name": n, "arguments": j(a)}} for n, a in TWO_CALLS]
    messages = [{"role": "user", "content": "list and read"},
                {"role": "assistant", "content": None, "tool_calls": calls}]  # its template wants text arguments
    text = rendered_reply(tokenizer, messages, "<｜end▁of▁sentence｜>", raw=True)
    ids, reply = stream_ids(tokenizer, text, "deepseek_v3", None)
    assert tokenizer.convert_tokens_to_ids("<｜tool▁call▁begin｜>") in ids
    assert (reply.content, reply.flags) == ("", ())
    assert [(c.name, c.args()) for c in reply.tool_calls] == TWO_CALLS


@pytest.mark.parametrize("family, name", [("gptoss", "harmony_call"), ("gptoss", "harmony_final"),
                                          ("deepseek_v3", "deepseek_v3.1"), ("llama3_1", "llama3_json"),
                                          ("gemma3", "tool_code"), ("gemma3", "tool_code_hyphens")])
def test_replies_through_each_real_tokenizer_parse_as_their_text_does(family, name):
    tools, reasoning, text, thought, content, calls = REPLIES[name]
    tokenizer = real_tokenizer(family)
    ids, reply = stream_ids(tokenizer, text, tools, reasoning)
    if family == "gptoss":  # harmony's markers are single special tokens of o200k_harmony
        assert tokenizer.convert_tokens_to_ids("<|channel|>") in ids and tokenizer.convert_tokens_to_ids(
            "<|message|>") in ids
    assert (reply.reasoning, reply.content, reply.flags) == (thought, content, ())
    assert [(c.name, c.args()) for c in reply.tool_calls] == calls
