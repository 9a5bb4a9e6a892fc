"""messages.py: the four provider request shapes (docs/design.md §7) as one chat-message list."""
from __future__ import annotations

import pytest

from polar_traj.messages import conversation_messages

SCHEMA = {"type": "object", "properties": {"cmd": {"type": "string"}}}
CALL = {"id": "call_1", "type": "function", "function": {"name": "sh", "arguments": '{"cmd": "ls"}'}}
EXPECTED = [
    {"role": "system", "content": "sys"},
    {"role": "user", "content": "fix bug"},
    {"role": "assistant", "content": "", "reasoning_content": "think", "tool_calls": [CALL]},
    {"role": "tool", "content": "a.py", "tool_call_id": "call_1"},
    {"role": "assistant", "content": "done"},
]
TOOLS = [{"type": "function", "function": {"name": "sh", "description": "run", "parameters": SCHEMA}}]


def test_openai_chat():
    request = {"model": "m", "stream": True, "tools": TOOLS, "messages": [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": [{"type": "text", "text": "fix "}, {"type": "text", "text": "bug"}]},
        {"role": "assistant", "content": None, "reasoning_content": "think", "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "call_1", "content": "a.py"},
    ]}
    response = {"object": "chat.completion", "choices": [{"message": {"role": "assistant", "content": "done"}}]}
    assert conversation_messages("openai_chat", request, response) == {"messages": EXPECTED, "tools": TOOLS}


def test_openai_responses():
    request = {"model": "m", "instructions": "sys", "input": [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "fix bug"}]},
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": "think"}], "encrypted_content": "x"},
        {"type": "function_call", "call_id": "call_1", "name": "sh", "arguments": '{"cmd": "ls"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "a.py"},
    ], "tools": [{"type": "function", "name": "sh", "description": "run", "parameters": SCHEMA},
                 {"type": "web_search"}]}
    response = {"output": [{"type": "reasoning", "summary": []},
                           {"type": "message", "role": "assistant",
                            "content": [{"type": "output_text", "text": "done"}]}]}
    got = conversation_messages("openai_responses", request, response)
    assert got == {"messages": EXPECTED, "tools": TOOLS + [{"type": "web_search"}]}


def test_openai_responses_string_input():
    got = conversation_messages("openai_responses", {"input": "hello"}, None)
    assert got["messages"] == [{"role": "user", "content": "hello"}]


def test_anthropic():
    request = {"model": "m", "system": [{"type": "text", "text": "sys", "cache_control": {"type": "ephemeral"}}],
               "tools": [{"name": "sh", "description": "run", "input_schema": SCHEMA}],
               "messages": [
                   {"role": "user", "content": "fix bug"},
                   {"role": "assistant", "content": [
                       {"type": "thinking", "thinking": "think", "signature": "sig"},
                       {"type": "tool_use", "id": "call_1", "name": "sh", "input": {"cmd": "ls"}}]},
                   {"role": "user", "content": [
                       {"type": "tool_result", "tool_use_id": "call_1", "content": [{"type": "text", "text": "a.py"}]}]},
               ]}
    response = {"type": "message", "role": "assistant", "content": [{"type": "text", "text": "done"}],
                "stop_reason": "end_turn"}
    assert conversation_messages("anthropic", request, response) == {"messages": EXPECTED, "tools": TOOLS}


def test_anthropic_tool_result_then_user_text():
    request = {"messages": [{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "t1", "content": "out"}, {"type": "text", "text": "go on"}]}]}
    assert conversation_messages("anthropic", request, None)["messages"] == [
        {"role": "tool", "content": "out", "tool_call_id": "t1"}, {"role": "user", "content": "go on"}]


def test_gemini():
    request = {"systemInstruction": {"parts": [{"text": "sys"}]},
               "tools": [{"functionDeclarations": [{"name": "sh", "description": "run", "parametersJsonSchema": SCHEMA}]}],
               "contents": [
                   {"role": "user", "parts": [{"text": "fix bug"}]},
                   {"role": "model", "parts": [{"text": "think", "thought": True},
                                               {"functionCall": {"name": "sh", "args": {"cmd": "ls"}},
                                                "thoughtSignature": "sig"}]},
                   {"role": "user", "parts": [{"functionResponse": {"name": "sh", "response": {"output": "a.py"}}}]},
               ]}
    response = {"candidates": [{"content": {"role": "model", "parts": [{"text": "done"}]}, "finishReason": "STOP"}]}
    got = conversation_messages("gemini", request, response)
    made_up = {**CALL, "id": "call_1_1"}  # Gemini sends no ids: results are matched by name
    assert got["messages"] == [
        EXPECTED[0], EXPECTED[1], {**EXPECTED[2], "tool_calls": [made_up]},
        {"role": "tool", "content": '{"output": "a.py"}', "tool_call_id": "call_1_1", "name": "sh"}, EXPECTED[4]]
    assert got["tools"] == TOOLS


def test_unknown_api():
    with pytest.raises(ValueError, match="unknown api"):
        conversation_messages("cohere", {}, None)
