"""The shared rendered-prefix cache (polar_mitm/tokens/prefix_cache.py): a first call whose system prompt and tools
another session already sent gets them from the cache, and its ids are exactly the chat template's; memory
stays bounded; a tokenizer that does not split at special tokens gets no cache."""
from __future__ import annotations

import json

import pytest

from polar_mitm.providers import CODECS
from polar_mitm.tokens.model import load_model
from polar_mitm.tokens.prefix_cache import PrefixCache, split_tokens
from polar_mitm.tokens.prompt import to_template_messages, to_template_tools
from tests.prompt_oracle import assert_prompt_faithful

SYSTEM = "You are a coding agent working in a terminal. Think before each step; run the tests. " * 60
TOOLS = [{"type": "function", "function": {
    "name": f"tool_{i}", "description": f"Tool {i}: " + "reads, writes or runs what it is told to. " * 12,
    "parameters": {"type": "object", "properties": {"path": {"type": "string", "description": "a file"}},
                   "required": ["path"]}}} for i in range(6)]


def first_calls() -> list[dict]:
    """First calls of sessions of one harness (same system prompt and tools) and of others (their own)."""
    bodies = []
    for n, user in enumerate(["fix the failing test", "héllo wörld ✓ 你好", "", "a" * 5000, "<|im_end|> inside text"]):
        bodies.append({"messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}],
                       "tools": TOOLS})
        bodies.append({"messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]})
        bodies.append({"messages": [{"role": "system", "content": f"Session {n}. " + SYSTEM},
                                    {"role": "user", "content": user}], "tools": TOOLS})
    # a history rendered in full (a session that moved or was evicted), with tool calls and results
    call = {"id": "c1", "type": "function", "function": {"name": "tool_0", "arguments": json.dumps({"path": "a.py"})}}
    bodies.append({"tools": TOOLS, "messages": [
        {"role": "system", "content": SYSTEM}, {"role": "user", "content": "look at a.py"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "print('hi')\n" * 400},
        {"role": "assistant", "content": "It prints hi."}, {"role": "user", "content": "thanks"}]})
    return [{"model": "tiny", **b} for b in bodies]


@pytest.fixture(scope="module")
def model(tiny_model_dir):
    return load_model(str(tiny_model_dir), "hermes", "think")


def template_ids(tokenizer, conv) -> list[int]:
    ids = tokenizer.apply_chat_template(to_template_messages(conv.messages), tools=to_template_tools(conv.tools),
                                        add_generation_prompt=True, tokenize=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def again(body: dict) -> dict:
    """The same call with another last message: a new session of the same harness."""
    last = body["messages"][-1]
    return {**body, "messages": body["messages"][:-1] + [{**last, "content": last["content"] + " (again)"}]}


def test_every_cached_first_call_equals_the_chat_template(model):
    renderer, codec = model.renderer, CODECS["openai_chat"]
    # round 2 finds every shared prefix cached; round 3 repeats round 2 exactly (the whole-prompt cache)
    for rounds in (first_calls(), [again(b) for b in first_calls()], [again(b) for b in first_calls()]):
        for body in rounds:
            conv = codec.parse_request(json.loads(json.dumps(body)), "/v1/chat/completions")
            ids = renderer.render_full(conv)
            assert ids == template_ids(model.tokenizer, conv), body["messages"][-1]["content"][:40]
            assert_prompt_faithful({"api": "openai_chat", "call_id": "c", "request": body, "prompt_ids": ids,
                                    "prefix_source": "rendered:first_call"}, model.tokenizer)
    cache = renderer.prefixes
    assert cache.enabled and cache.hits >= len(first_calls()) and cache.size[0] >= 3
    assert renderer.whole.hits >= len(first_calls())


def test_the_cache_is_bounded(model):
    tokenizer = model.tokenizer
    cache = PrefixCache(model.renderer.encode, split_tokens(tokenizer), max_ids=20_000, max_entries=3,
                        min_chars=100)
    for n in range(10):
        text = f"<|im_start|>system\nsession {n} " + "x y " * 2000 + "<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
        assert cache.encode(text, len(text) - 20) == model.renderer.encode(text)
        prefixes, ids = cache.size
        assert prefixes <= 3 and ids <= 20_000


def test_a_tokenizer_that_marks_each_piece_of_text_gets_no_cache(model):
    def marked(text: str) -> list[int]:  # like a tokenizer that prepends a start mark to every text it is given
        return [0] + model.renderer.encode(text)

    cache = PrefixCache(marked, split_tokens(model.tokenizer), min_chars=10)
    text = "<|im_start|>system\n" + SYSTEM + "<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
    assert cache.encode(text, len(text) - 10) == marked(text)
    assert not cache.enabled and cache.encode(text, len(text) - 10) == marked(text)
