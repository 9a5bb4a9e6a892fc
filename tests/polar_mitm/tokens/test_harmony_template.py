"""Polar's harmony template (polar_mitm/tokens/templates/harmony.jinja) against gpt-oss's own renderer,
openai-harmony (tests/harmony_reference.py): for the real o200k_harmony tokenizer, which ships no chat template,
the proxy renders with it, and each conversation here must be the very ids openai-harmony renders. The tools:
the harnesses' recorded ones (fixtures/requests) and every JSON-schema form harmony writes its own way."""
from __future__ import annotations

import json

import pytest
from transformers import AutoTokenizer

from polar_mitm.tokens.family import TEMPLATES
from polar_mitm.tokens.model import load_model
from tests.conftest import ROOT
from tests.harmony_reference import encoding, harmony_ids
from tests.polar_mitm.tokens.test_reply_families import TOKENIZERS

GPTOSS = TOKENIZERS / "gptoss"


@pytest.fixture(scope="module")
def harmony():
    assert (GPTOSS / ".installed").is_file(), f"{GPTOSS}: run `make setup` (scripts/fetch_tokenizers.sh)"
    tokenizer = AutoTokenizer.from_pretrained(str(GPTOSS))
    tokenizer.chat_template = (TEMPLATES / "harmony.jinja").read_text()
    return tokenizer, encoding(GPTOSS)


def assert_same(harmony, messages, tools) -> None:
    tokenizer, enc = harmony
    text = tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False)
    want = harmony_ids(enc, messages, tools)
    if tokenizer.encode(text, add_special_tokens=False) != want:
        expected = enc.decode_utf8(want)
        at = next((i for i, (a, b) in enumerate(zip(text, expected)) if a != b), min(len(text), len(expected)))
        raise AssertionError(f"differs at {at}: ours {text[at - 80:at + 80]!r}, harmony {expected[at - 80:at + 80]!r}")


def _function(name: str, description: str, parameters) -> dict:
    fn = {"name": name, "description": description}
    return {"type": "function", "function": fn if parameters is None else {**fn, "parameters": parameters}}


def recorded_tools(name: str) -> list[dict]:
    body = json.loads((ROOT / "fixtures" / "requests" / name).read_text())
    return [t if "function" in t else _function(t["name"], t.get("description", ""), t.get("input_schema"))
            for t in body["tools"] if "function" in t or "input_schema" in t]


SCHEMA = {"type": "object", "required": ["e"], "properties": {
    "e": {"type": "string", "enum": ["x", "y"], "description": "an enum"},
    "d": {"type": "integer", "default": 3, "description": "with a default"},
    "n": {"type": ["string", "null"]}, "t": {"type": ["integer", "null"], "default": None},
    "u": {"anyOf": [{"type": "string"}, {"type": "number"}], "description": "anyOf: any"},
    "one": {"oneOf": [{"type": "string", "description": "s"}, {"type": "integer"}]},
    "strings": {"type": "array", "items": {"type": "string"}, "default": ["x"]}, "untyped": {"type": "array"},
    "nested": {"type": "array", "items": {"type": "array", "items": {"type": "integer"}}},
    "union_items": {"type": "array", "items": {"type": ["string", "number"]}},
    "b": {"type": "boolean", "default": False}, "any": {}, "null": {"type": "null"},
    "const": {"type": "string", "const": "z"},
    "lines": {"type": "string", "description": "line one\nline two"}, "hi": {"type": "string", "default": "hi"},
    "numbers": {"enum": [1, 2]}, "ex": {"type": "string", "examples": ["q"]},
    "free": {"type": "object", "default": {"a": 1}},
    "outer": {"type": "object", "description": "outer", "properties": {
        "mid": {"type": "object", "description": "mid", "required": ["leaf"], "properties": {
            "leaf": {"type": "string", "enum": ["a"], "description": "leaf", "default": "a"}}},
        "choice": {"oneOf": [{"type": "string"}, {"type": "object", "properties": {"z": {"type": "string"}}}]},
        "items": {"type": "array", "description": "items", "items": {
            "type": "object", "description": "an item",
            "properties": {"w": {"type": "string", "description": "w\nx"}}}}}},
}}


@pytest.mark.parametrize("tools", [
    recorded_tools("opencode_chat_turn2.json"), recorded_tools("qwen_chat_turn2.json"),
    recorded_tools("claude_anthropic_turn2.json"),
    [_function("every", "each form\nof schema", SCHEMA), _function("empty", "", {"type": "object", "properties": {}}),
     _function("bare", "no parameters", None), _function("untyped", "no properties", {"type": "object"})],
], ids=["opencode", "qwen-code", "claude-code", "schema-forms"])
def test_tools_are_written_as_harmony_writes_them(harmony, tools):
    assert_same(harmony, [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}], tools)


SHELL = [_function("bash", "Run", {"type": "object", "properties": {"command": {"type": "string"}},
                                   "required": ["command"]})]


def call(id_: str, command: str | dict) -> dict:
    args = command if isinstance(command, dict) else json.dumps({"command": command})
    return {"id": id_, "type": "function", "function": {"name": "bash", "arguments": args}}


SESSION = [
    {"role": "system", "content": "S"}, {"role": "user", "content": "list"},
    {"role": "assistant", "content": "Listing.", "reasoning_content": "run ls",
     "tool_calls": [call("c1", "ls"), call("c2", {"command": "pwd"})]},
    {"role": "tool", "tool_call_id": "c1", "content": "a.txt"}, {"role": "tool", "tool_call_id": "c2", "content": "/w"},
    {"role": "assistant", "content": "There is a.txt.", "reasoning_content": "seen"},
    {"role": "user", "content": [{"type": "text", "text": "thanks"}]}, {"role": "system", "content": "a late note"},
    {"role": "assistant", "content": "", "reasoning_content": "again", "tool_calls": [call("c3", "ls -la")]},
    {"role": "tool", "tool_call_id": "c3", "name": "bash", "content": "x"},
    {"role": "assistant", "content": "ok", "reasoning_content": "done"}, {"role": "user", "content": "bye"},
]


@pytest.mark.parametrize("upto", range(2, len(SESSION) + 1))
def test_each_prefix_of_a_session_is_harmonys_rendering(harmony, upto):
    """Calls (two in a turn), results, a final answer, a later system message; reasoning kept while the last
    assistant message is a call, dropped up to the first final answer once it is a final one."""
    assert_same(harmony, SESSION[:upto], SHELL)


def test_without_tools_or_system(harmony):
    assert_same(harmony, SESSION[1:2], None)
    assert_same(harmony, SESSION[:2], None)


def test_the_proxy_renders_a_template_less_gpt_oss_tokenizer_with_it(tmp_path):
    model = load_model(str(GPTOSS))
    assert (model.tool_parser, model.reasoning_parser) == ("harmony", "harmony")
    assert "Polar's harmony.jinja renders" in model.family
    assert model.tokenizer.chat_template == (TEMPLATES / "harmony.jinja").read_text()
    bare = tmp_path / "no-template"
    bare.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):  # another family's tokenizer, no template: refused
        (bare / name).write_text((TOKENIZERS / "llama3_1" / name).read_text().replace('"chat_template"', '"_x"'))
    with pytest.raises(ValueError, match="has no chat template"):
        load_model(str(bare))
