"""polar_mitm/engines/chat.py: the engine-side rendering's request, and its answers folded into ids, logprobs and
reply events, whole or in streamed pieces; an answer without token ids, or of a shape no chat API gives, is an
EngineError (the harness gets the provider's error, the record the reason)."""
from __future__ import annotations

import pytest

from polar_mitm.conversation import (ContentDelta, Conversation, Message, ReasoningDelta, Sampling, Tool, ToolCall,
                                     ToolCallDone)
from polar_mitm.engines.api import EngineError, EngineOutput
from polar_mitm.engines.chat import EngineReply, apply_chat, chat_request


def test_the_request_asks_for_ids_and_logprobs_and_keeps_the_turns():
    conv = Conversation("anthropic", "m", (
        Message("user", "hi"), Message("assistant", "", "plan", (ToolCall("t1", "sh", '{"c": "ls"}'),)),
        Message("tool", "a.txt", tool_call_id="t1", name="sh")), (Tool("sh", "Run", {"type": "object"}),))
    path, body = chat_request(conv, Sampling(temperature=0.5, seed=3, stop=("END",)), 64, True, "served")
    assert path == "/v1/chat/completions"
    assert {k: body[k] for k in ("max_tokens", "logprobs", "return_token_ids", "stream", "model", "temperature",
                                 "seed", "stop")} == {"max_tokens": 64, "logprobs": True, "return_token_ids": True,
                                                      "stream": True, "model": "served", "temperature": 0.5,
                                                      "seed": 3, "stop": ["END"]}
    assert body["messages"] == [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "", "reasoning_content": "plan", "tool_calls": [
            {"id": "t1", "type": "function", "function": {"name": "sh", "arguments": '{"c": "ls"}'}}]},
        {"role": "tool", "content": "a.txt", "tool_call_id": "t1", "name": "sh"}]
    assert body["tools"] == [{"type": "function", "function": {"name": "sh", "description": "Run",
                                                               "parameters": {"type": "object"}}}]


def test_a_streamed_answer_folds_into_ids_logprobs_and_events():
    out, reply = EngineOutput(), EngineReply("call_x_")
    chunks = [
        {"prompt_token_ids": [1, 2, 3], "choices": [{"delta": {"role": "assistant", "content": ""}, "token_ids": []}]},
        {"choices": [{"delta": {"reasoning_content": "hm"}, "token_ids": [7], "logprobs": {"content": [
            {"token": "hm", "logprob": -0.5}]}}]},
        {"choices": [{"delta": {"content": "Running."}, "token_ids": [8], "logprobs": {"content": [
            {"token": "R", "logprob": -0.25}]}}]},
        {"choices": [{"delta": {"tool_calls": [{"index": 0, "id": "c9", "function": {"name": "sh",
                                                                                      "arguments": '{"c": '}}]},
                      "token_ids": [9], "logprobs": {"content": [{"token": "{", "logprob": -1.0}]}}]},
        {"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"arguments": '"ls"}'}}]},
                      "token_ids": [10], "logprobs": {"content": [{"token": "}", "logprob": -2.0}]},
                      "finish_reason": "tool_calls"}]},
    ]
    prompts, events = [], []
    for chunk in chunks:
        prompt, got = apply_chat(chunk, out, reply)
        prompts.append(prompt)
        events += got
    assert prompts == [[1, 2, 3], None, None, None, None]
    assert (out.output_ids, out.logprobs, out.finish_reason) == ([7, 8, 9, 10], [-0.5, -0.25, -1.0, -2.0], "stop")
    assert events == [ReasoningDelta("hm"), ContentDelta("Running.")]
    assert reply.finish() == [ToolCallDone(0, ToolCall("c9", "sh", '{"c": "ls"}'))] and reply.finish() == []
    result = reply.result()
    assert (result.content, result.reasoning, result.tool_calls, result.flags) == (
        "Running.", "hm", (ToolCall("c9", "sh", '{"c": "ls"}'),), ())


def test_a_whole_answer_and_a_call_without_an_id():
    out, reply = EngineOutput(), EngineReply("call_x_")
    prompt, events = apply_chat({"prompt_token_ids": [4], "choices": [{
        "message": {"role": "assistant", "content": None, "tool_calls": [
            {"type": "function", "function": {"name": "sh", "arguments": "not json"}}]},
        "token_ids": [5, 6], "finish_reason": "tool_calls"}]}, out, reply)
    assert (prompt, events, out.output_ids) == ([4], [], [5, 6])
    (done,) = reply.finish()
    assert done.call == ToolCall("call_x_0", "sh", "not json")
    assert reply.result().flags == ("tool_arguments_not_json:sh",)


@pytest.mark.parametrize("answer, fragment", [
    ({"choices": [{"message": {"content": "hi"}, "finish_reason": "stop"}]}, "no token ids"),
    ({"error": {"message": "model not found"}}, "model not found"),
    ({"choices": [5]}, "malformed chat answer"),
    ({"choices": [{"delta": {"tool_calls": [{"index": "x"}]}, "token_ids": []}]}, "malformed chat answer"),
])
def test_an_answer_that_is_not_tokens_is_an_engine_error(answer, fragment):
    with pytest.raises(EngineError, match=fragment):
        apply_chat(answer, EngineOutput(), EngineReply("call_x_"))
