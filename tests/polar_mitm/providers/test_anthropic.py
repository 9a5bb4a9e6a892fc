"""Anthropic Messages codec, checked against the anthropic SDK's models and MessageStream accumulator."""
from __future__ import annotations

import json

import anthropic
import httpx
import pytest
from anthropic.types import Message as SDKMessage
from anthropic.types import ModelInfo, RawMessageStreamEvent
from pydantic import TypeAdapter

from polar_mitm.conversation import (
    Completion,
    ContentDelta,
    Message,
    ProviderError,
    ReasoningDelta,
    Sampling,
    ToolCall,
)
from polar_mitm.providers import anthropic as codec
from polar_mitm.providers._common import encode_reasoning
from tests.polar_mitm.codec_helpers import (
    BASE_URL,
    REPLIES,
    completion_for,
    expected_assistant,
    load_request,
    mock_http,
    sse_payloads,
    sse_response,
    stream_for,
)

EVENT = TypeAdapter(RawMessageStreamEvent)


def test_claude_code_request():
    conv = codec.parse_request(load_request("claude_anthropic_turn2.json"), "/v1/messages?beta=true")
    assert (conv.api, conv.model, conv.stream) == ("anthropic", "claude-sonnet-4-5-20250929", True)
    assert conv.sampling == Sampling(max_tokens=32000, temperature=1.0)
    system, user, turn, result, reminder = conv.messages
    assert system.content == ("You are Claude Code, Anthropic's official CLI for Claude.\n\n"
                              "You are an interactive CLI tool that helps users with software engineering tasks.")
    assert user.role == "user" and user.content.endswith("</system-reminder>\n\nFix the failing test in test_math.py")
    # a signature Polar did not make (a hand-written stand-in for Anthropic's): the thinking text is the reasoning
    assert turn == Message(
        "assistant", "I'll run the tests first.",
        "The user wants the failing test fixed. I should run the tests to see which one fails.",
        (ToolCall("toolu_01AbCdEf", "Bash", '{"command": "pytest -q", "description": "Run the test suite"}'),),
    )
    assert result == Message("tool", "F.\n1 failed, 1 passed in 0.02s", tool_call_id="toolu_01AbCdEf", name="Bash")
    assert reminder == Message("user", "<system-reminder>\nThe todo list is empty.\n</system-reminder>")
    assert [t.name for t in conv.tools] == ["Bash", "Read"]  # the web_search server tool is dropped
    assert conv.tools[0].parameters["required"] == ["command"]


def test_tool_results_keep_their_place_among_user_text():
    body = {"model": "m", "max_tokens": 5, "system": "S", "stop_sequences": ["\n\nHuman:"], "top_k": 5, "messages": [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "a", "input": {}},
                                          {"type": "tool_use", "id": "t2", "name": "b", "input": {"x": [1]}}]},
        {"role": "user", "content": [
            {"type": "text", "text": "before"},
            {"type": "tool_result", "tool_use_id": "t2", "content": [{"type": "text", "text": "two"},
                                                                     {"type": "image", "source": {}}]},
            {"type": "tool_result", "tool_use_id": "t1", "content": "one", "is_error": True},
            {"type": "text", "text": "after"},
        ]},
    ]}
    conv = codec.parse_request(body, "/v1/messages")
    assert [(m.role, m.content, m.name) for m in conv.messages[3:]] == [
        ("user", "before", None), ("tool", "two\n[image omitted: this model reads text only]", "b"),
        ("tool", "one", "a"), ("user", "after", None)]
    assert conv.sampling == Sampling(max_tokens=5, top_k=5, stop=("\n\nHuman:",))


def test_count_tokens_body_parses_without_max_tokens():
    conv = codec.parse_request({"model": "m", "messages": [{"role": "user", "content": "hi"}]},
                               "/v1/messages/count_tokens")
    assert conv.messages == (Message("user", "hi"),) and conv.sampling.max_tokens is None
    assert codec.render_count_tokens(17) == {"input_tokens": 17}


@pytest.mark.parametrize(
    "body, needle",
    [
        ({"messages": [{"role": "user", "content": "x"}]}, "model"),
        ({"model": "m", "messages": []}, "must not be empty"),
        ({"model": "m", "messages": [{"role": "developer", "content": "x"}]}, "'developer'"),
        ({"model": "m", "messages": [{"role": "user", "content": [{"type": "tool_use"}]}]}, "'tool_use'"),
        ({"model": "m", "messages": [{"role": "assistant", "content": [{"type": "server_tool_use"}]}]},
         "'server_tool_use'"),
        ({"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": 3}]}]}, ".text"),
        ({"model": "m", "messages": [{"role": "user", "content": [{"type": "tool_result"}]}]}, "tool_use_id"),
        ({"model": "m", "messages": [{"role": "user", "content": "x"}], "stop_sequences": "x", "top_k": 1.5}, "top_k"),
        ({"model": "m", "messages": [{"role": "user", "content": "x"}], "system": [{"type": "image"}]}, "'image'"),
    ],
)
def test_malformed_requests_are_400(body, needle):
    with pytest.raises(ProviderError) as err:
        codec.parse_request(body, "/v1/messages")
    assert err.value.status == 400 and needle in err.value.message


def _client(answer) -> anthropic.Anthropic:
    return anthropic.Anthropic(api_key="polar-token", base_url=BASE_URL, http_client=mock_http(answer), max_retries=0)


@pytest.mark.parametrize("scenario", sorted(REPLIES))
def test_render_parses_in_sdk_and_stream_accumulates_to_the_same(scenario):
    c = completion_for(scenario, "msg_01Xy")
    rendered = codec.render_response(c)
    plain = SDKMessage.model_validate(rendered)
    stop = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}[c.finish_reason]
    assert plain.stop_reason == stop and (plain.usage.input_tokens, plain.usage.output_tokens) == (321, 45)

    data = stream_for(scenario, codec.StreamEncoder(c.id, c.model, prompt_tokens=321), c)
    records = sse_payloads(data)
    assert all(name == payload["type"] for name, payload in records)
    assert [name for name, _ in records][:2] == ["message_start", "ping"]
    for _, payload in records[2:]:  # ping is not a message event: the SDK skips it
        EVENT.validate_python(payload)

    client = _client(lambda body, req: sse_response(data) if body.get("stream") else httpx.Response(200, json=rendered))
    kwargs = {"model": c.model, "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]}
    with client.messages.stream(**kwargs) as s:
        final = s.get_final_message()
    assert final.model_dump(exclude_none=True) == plain.model_dump(exclude_none=True)
    assert client.messages.create(**kwargs).model_dump() == plain.model_dump()


@pytest.mark.parametrize("scenario", sorted(REPLIES))
@pytest.mark.parametrize("keep", ["everything", "signature_only"])
def test_round_trip_through_the_harness(scenario, keep):
    body = load_request("claude_anthropic_turn2.json")
    c = completion_for(scenario, "msg_02Ab")
    blocks = json.loads(json.dumps(codec.render_response(c)["content"]))
    for block in blocks:
        if keep == "signature_only" and block["type"] == "thinking":
            block["thinking"] = ""  # the signature alone must bring the reasoning back
    blocks[-1]["cache_control"] = {"type": "ephemeral"}  # claude moves its cache breakpoint to the newest block
    body["messages"] += [{"role": "assistant", "content": blocks}]
    if c.tool_calls:
        body["messages"] += [{"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": t.id, "content": "ok"} for t in c.tool_calls]}]
    conv = codec.parse_request(body, "/v1/messages?beta=true")
    assert conv.messages[5] == expected_assistant(c)
    assert [(m.tool_call_id, m.name) for m in conv.messages[6:]] == [(t.id, t.name) for t in c.tool_calls]


def test_redacted_thinking_counts_only_when_ours():
    body = {"model": "m", "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": [
        {"type": "redacted_thinking", "data": "EmwKAhgBEgy3opaque"},
        {"type": "redacted_thinking", "data": encode_reasoning("mine")}, {"type": "text", "text": "A"}]}]}
    assert codec.parse_request(body, "/v1/messages").messages[-1] == Message("assistant", "A", "mine")


def test_interleaved_thinking_gets_one_signed_block_per_run():
    c = Completion("msg_x", "m", "A", "r1\nr2", (), "stop", 1, 1)
    enc = codec.StreamEncoder(c.id, c.model)
    data = enc.start() + enc.feed(ReasoningDelta("r1")) + enc.feed(ContentDelta("A")) + enc.feed(
        ReasoningDelta("r2")) + enc.finish(c)
    client = _client(lambda body, req: sse_response(data))
    with client.messages.stream(model="m", max_tokens=9, messages=[{"role": "user", "content": "q"}]) as s:
        final = s.get_final_message()
    assert [b.type for b in final.content] == ["thinking", "text", "thinking"]
    resent = {"model": "m", "messages": [{"role": "user", "content": "q"},
                                         {"role": "assistant", "content": [b.model_dump() for b in final.content]}]}
    assert codec.parse_request(resent, "/v1/messages").messages[-1] == Message("assistant", "A", "r1\nr2")


@pytest.mark.parametrize(
    "err, exc_type, kind",
    [
        (ProviderError(400, "messages must not be empty"), anthropic.BadRequestError, "invalid_request_error"),
        (ProviderError(400, "prompt is too long", "context_length_exceeded"), anthropic.BadRequestError,
         "invalid_request_error"),
        (ProviderError(401, "unknown credentials"), anthropic.AuthenticationError, "authentication_error"),
        (ProviderError(529, "busy"), anthropic.OverloadedError, "overloaded_error"),
        (ProviderError(502, "engine down", "api_error"), anthropic.InternalServerError, "api_error"),
    ],
)
def test_errors_reach_the_sdk_as_its_own_exceptions(err, exc_type, kind):
    client = _client(lambda body, req: httpx.Response(err.status, json=codec.render_error(err)))
    with pytest.raises(exc_type) as caught:
        client.messages.create(model="m", max_tokens=5, messages=[{"role": "user", "content": "hi"}])
    assert caught.value.body["error"] == {"type": kind, "message": err.message}


def test_error_mid_stream_raises_in_sdk():
    enc = codec.StreamEncoder("msg_1", "m")
    data = enc.start() + enc.feed(ContentDelta("par")) + enc.fail(ProviderError(529, "overloaded"))
    client = _client(lambda body, req: sse_response(data))
    with pytest.raises(anthropic.APIStatusError, match="overloaded"):
        with client.messages.stream(model="m", max_tokens=9, messages=[{"role": "user", "content": "q"}]) as s:
            s.get_final_message()


def test_models_list_parses_in_sdk():
    client = _client(lambda body, req: httpx.Response(200, json=codec.render_models(["polar-tiny"])))
    assert [m.id for m in client.models.list()] == ["polar-tiny"]
    ModelInfo.model_validate(codec.render_models(["x"])["data"][0])


def test_mid_conversation_system_turn_stays_in_place():
    """Claude Code 2.1 sends a `system` message after the user's task on a session's first call."""
    body = {"model": "m", "max_tokens": 5, "system": "S", "messages": [
        {"role": "user", "content": "task"}, {"role": "system", "content": [{"type": "text", "text": "# Env"}]}]}
    conv = codec.parse_request(body, "/v1/messages")
    assert [(m.role, m.content) for m in conv.messages] == [("system", "S"), ("user", "task"), ("system", "# Env")]
