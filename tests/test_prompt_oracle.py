"""The prompt oracle itself: it passes faithful prompts and fails prompts that lost, changed or reordered a text.

Faithful prompts come two ways: the chat template applied directly to a hand-made OpenAI Chat request, and the
proxy's own rendering of each provider's fixture request (fixtures/requests). The mutations are applied to what
is rendered, never to the request the oracle reads, so each one is a prompt that no longer says what the
harness sent.
"""
from __future__ import annotations

import copy
import json
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

import pytest
from transformers import AutoTokenizer

from polar_mitm.providers import codec
from polar_mitm.tokens.prompt import ChatRenderer
from polar_traj.records import CallRecord
from tests.prompt_oracle import assert_prompt_faithful

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "requests"
SHELL = {"type": "function", "function": {"name": "shell", "description": "Run a shell command", "parameters": {
    "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}
CHAT = {"model": "tiny", "tools": [SHELL], "messages": [
    {"role": "system", "content": "You are a coding agent.\n  Keep answers short."},
    {"role": "user", "content": "Create polar.txt"},
    {"role": "assistant", "content": "I will write it.", "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "shell", "arguments": '{"command":"echo polar > polar.txt"}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "written\nexit code 0"},
    {"role": "assistant", "content": "Done."},
    {"role": "user", "content": "Now check it."},
]}


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return AutoTokenizer.from_pretrained(str(tiny_model_dir))


def record(api: str, request: dict[str, Any], prompt_ids: list[int], source: str = "substituted",
           error: str | None = None) -> dict[str, Any]:
    return {"api": api, "call_id": "c1", "request": request, "prompt_ids": prompt_ids, "prefix_source": source,
            "error": error}


def template_ids(tokenizer, messages: list[dict[str, Any]], tools=None, generation_prompt: bool = True) -> list[int]:
    """The tiny model's template applied directly (arguments as an object, as HF templates expect)."""
    messages = copy.deepcopy(messages)
    for m in messages:
        for c in m.get("tool_calls") or []:
            c["function"]["arguments"] = json.loads(c["function"]["arguments"])
    text = tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=generation_prompt,
                                         tokenize=False)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def test_the_chat_template_of_the_request_passes(tokenizer):
    ids = template_ids(tokenizer, CHAT["messages"], CHAT["tools"])
    assert_prompt_faithful(record("openai_chat", CHAT, ids, "rendered:first_call"), tokenizer)
    as_record = CallRecord(call_id="c1", task_id="t", session_id="s", api="openai_chat", model="tiny",
                           stream=False, started_at=0.0, ended_at=0.0, latency_ms=0.0, policy_version=None,
                           prompt_ids=tuple(ids), output_ids=(), output_logprobs=(), finish_reason=None,
                           prefix_source="rendered:first_call", parent_call_id=None, request=CHAT, response=None)
    assert_prompt_faithful(as_record, tokenizer)


def _blank_tool_result(ms):
    return [dict(m, content="") if m["role"] == "tool" else m for m in ms]


def _swap_user_and_tool(ms):
    return [ms[0], ms[1], ms[2], ms[5], ms[4], ms[3]]


def _swap_assistant_turns(ms):
    return [ms[0], ms[1], ms[4], ms[3], ms[2], ms[5]]


def _drop_system(ms):
    return ms[1:]


def _edit_user_text(ms):
    return [dict(m, content="Create polar.md") if m["content"] == "Create polar.txt" else m for m in ms]


def _cut_tool_result_line(ms):
    return [dict(m, content="written") if m["role"] == "tool" else m for m in ms]


MUTATIONS: dict[str, Callable[[list[dict[str, Any]]], list[dict[str, Any]]]] = {
    "tool result blanked": _blank_tool_result, "user text and tool result swapped": _swap_user_and_tool,
    "assistant turns swapped": _swap_assistant_turns, "system prompt dropped": _drop_system,
    "user text changed": _edit_user_text, "a tool result line lost": _cut_tool_result_line,
}


@pytest.mark.parametrize("source", ["substituted", "rendered:first_call"])
@pytest.mark.parametrize("mutation", MUTATIONS)
def test_a_prompt_that_lost_or_reordered_a_text_fails(tokenizer, mutation, source):
    ids = template_ids(tokenizer, MUTATIONS[mutation](CHAT["messages"]), CHAT["tools"])
    with pytest.raises(AssertionError, match="not in the prompt in the order sent"):
        assert_prompt_faithful(record("openai_chat", CHAT, ids, source), tokenizer)


def test_a_dropped_tool_definition_fails(tokenizer):
    ids = template_ids(tokenizer, CHAT["messages"], None)
    with pytest.raises(AssertionError, match=r"tools\[0\] \(name and description\) is not in the prompt"):
        assert_prompt_faithful(record("openai_chat", CHAT, ids), tokenizer)


def test_a_rendered_chat_prompt_must_be_the_template_exactly(tokenizer):
    """Every text is there, but the generation prompt is missing: only the direct template comparison sees it."""
    ids = template_ids(tokenizer, CHAT["messages"], CHAT["tools"], generation_prompt=False)
    assert_prompt_faithful(record("openai_chat", CHAT, ids, "substituted"), tokenizer)
    with pytest.raises(AssertionError, match="differ from the chat template"):
        assert_prompt_faithful(record("openai_chat", CHAT, ids, "rendered:first_call"), tokenizer)


def test_whitespace_may_be_reindented_per_line(tokenizer):
    ids = template_ids(tokenizer, [dict(m, content="    You are a coding agent.\nKeep   answers short.  ")
                                   if m["role"] == "system" else m for m in CHAT["messages"]], CHAT["tools"])
    assert_prompt_faithful(record("openai_chat", CHAT, ids), tokenizer)


def test_a_system_prompt_inside_the_conversation_may_be_hoisted_but_stays_in_order(tokenizer):
    body = {"model": "tiny", "messages": [{"role": "system", "content": "Rule A."},
                                          {"role": "user", "content": "Create polar.txt"},
                                          {"role": "developer", "content": "Rule B."}]}
    user = {"role": "user", "content": "Create polar.txt"}
    in_place = [{"role": "system", "content": "Rule A."}, user, {"role": "system", "content": "Rule B."}]
    for messages in ([{"role": "system", "content": "Rule A.\n\nRule B."}, user], in_place):
        assert_prompt_faithful(record("openai_chat", body, template_ids(tokenizer, messages)), tokenizer)
    swapped = [{"role": "system", "content": "Rule B.\n\nRule A."}, user]
    with pytest.raises(AssertionError, match=r"messages\[2\] \(developer\)"):
        assert_prompt_faithful(record("openai_chat", body, template_ids(tokenizer, swapped)), tokenizer)


def test_a_refused_call_without_prompt_passes_only_with_its_error(tokenizer):
    assert_prompt_faithful(record("openai_chat", {"messages": "nope"}, [], error="bad request"), tokenizer)
    with pytest.raises(AssertionError, match="no prompt_ids and no error"):
        assert_prompt_faithful(record("openai_chat", CHAT, []), tokenizer)


def test_an_unknown_request_shape_is_named(tokenizer):
    body = {"model": "m", "input": [{"type": "web_search_call", "id": "ws_1"}]}
    with pytest.raises(ValueError, match="input item type 'web_search_call'"):
        assert_prompt_faithful(record("openai_responses", body, [1, 2]), tokenizer)


# ---------------------------------------------------------------- every API: the proxy's rendering of a fixture

FIXTURE_APIS = {"claude_anthropic_turn2.json": ("anthropic", "/v1/messages"),
                "codex_responses_turn2.json": ("openai_responses", "/v1/responses"),
                "pi_responses_turn2.json": ("openai_responses", "/v1/responses"),
                "gemini_cli_turn2.json": ("gemini", None),
                "opencode_chat_turn2.json": ("openai_chat", "/v1/chat/completions"),
                "qwen_chat_turn2.json": ("openai_chat", "/v1/chat/completions")}


def fixture_call(name: str):
    api, path = FIXTURE_APIS[name]
    body = json.loads((FIXTURES / name).read_text())
    if path is None:
        body, path = body["body"], body["path"]
    return api, body, codec(api).parse_request(body, path)


def rendered(tokenizer, conv) -> list[int]:
    return ChatRenderer(tokenizer).render_full(conv)


def _conv_blank_tools(messages):
    return tuple(replace(m, content="") if m.role == "tool" else m for m in messages)


def _conv_swap_last_two(messages):
    return messages[:-2] + (messages[-1], messages[-2])


@pytest.mark.parametrize("name", FIXTURE_APIS)
def test_each_apis_fixture_rendered_by_the_proxy_passes(tokenizer, name):
    api, body, conv = fixture_call(name)
    assert_prompt_faithful(record(api, body, rendered(tokenizer, conv), "rendered:first_call"), tokenizer)


@pytest.mark.parametrize("mutate", [_conv_blank_tools, _conv_swap_last_two], ids=["tool_blanked", "swapped"])
@pytest.mark.parametrize("name", FIXTURE_APIS)
def test_each_apis_fixture_with_a_lost_or_moved_message_fails(tokenizer, name, mutate):
    api, body, conv = fixture_call(name)
    assert any(m.role == "tool" for m in conv.messages)
    ids = rendered(tokenizer, replace(conv, messages=mutate(conv.messages)))
    with pytest.raises(AssertionError):
        assert_prompt_faithful(record(api, body, ids, "substituted"), tokenizer)


def test_a_structured_gemini_tool_result_may_be_shown_as_json(tokenizer):
    body = {"contents": [
        {"role": "user", "parts": [{"text": "Run it"}]},
        {"role": "model", "parts": [{"functionCall": {"name": "shell", "args": {"command": "ls"}}}]},
        {"role": "user", "parts": [{"functionResponse": {"name": "shell", "response": {
            "stdout": "a.txt\nb.txt", "exit_code": 0}}}]}]}
    as_json = '{"stdout": "a.txt\\nb.txt", "exit_code": 0}'
    messages = [{"role": "user", "content": "Run it"},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"id": "1", "type": "function", "function": {"name": "shell", "arguments": '{"command": "ls"}'}}]}]
    for shown in (as_json, "a.txt\nb.txt"):
        ids = template_ids(tokenizer, messages + [{"role": "tool", "content": shown}])
        assert_prompt_faithful(record("gemini", body, ids), tokenizer)
    ids = template_ids(tokenizer, messages + [{"role": "tool", "content": '{"exit_code": 0}'}])
    with pytest.raises(AssertionError, match="functionResponse.response.stdout"):
        assert_prompt_faithful(record("gemini", body, ids), tokenizer)
