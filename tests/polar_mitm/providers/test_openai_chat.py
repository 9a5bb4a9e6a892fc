"""OpenAI Chat Completions codec, checked against the openai SDK's own models and stream accumulator."""
from __future__ import annotations

import json

import httpx
import openai
import pytest
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
from openai.types import Model
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from polar_mitm.conversation import Message, ProviderError, Sampling, Tool, ToolCall
from polar_mitm.providers import CODECS, codec
from polar_mitm.providers import openai_chat as chat


def test_qwen_request():
    body = load_request("qwen_chat_turn2.json")
    conv = chat.parse_request(body, "/v1/chat/completions")
    assert (conv.api, conv.model, conv.stream) == ("openai_chat", "polar-tiny", True)
    assert [m.role for m in conv.messages] == ["system", "user", "assistant", "user", "assistant", "tool"]
    assert conv.messages[0].content.startswith("You are Qwen Code")
    assert conv.messages[4] == Message(
        "assistant", "", "I should run the tests to see what fails.",
        (ToolCall("call_0f3a", "run_shell_command", '{"command": "pytest -q", "is_background": false}'),),
    )
    assert conv.messages[5] == Message("tool", "Command: pytest -q\nOutput: F.\n1 failed, 1 passed\nExit Code: 1",
                                       tool_call_id="call_0f3a", name="run_shell_command")
    assert [t.name for t in conv.tools] == ["run_shell_command", "read_file"]
    assert conv.sampling == Sampling(max_tokens=8192, temperature=0.0, top_p=1.0)
    assert chat.encoder_options(body) == {"include_usage": True}


def test_opencode_request_joins_system_prompts():
    conv = chat.parse_request(load_request("opencode_chat_turn2.json"), "/v1/chat/completions")
    system, user, assistant, tool = conv.messages
    assert system.content.startswith("You are opencode, an interactive CLI tool")
    assert "software engineering tasks.\n\nHere is some useful information" in system.content
    assert user == Message("user", "Fix the failing test in test_math.py")
    assert assistant.content == "I'll run the tests." and assistant.reasoning is None
    assert assistant.tool_calls[0].args() == {"command": "pytest -q", "description": "Runs the test suite"}
    assert (tool.tool_call_id, tool.name) == ("call_1", "bash")
    assert conv.sampling.max_tokens == 32000 and conv.sampling.temperature == 0.55
    assert conv.tools[1] == Tool("edit", "Performs exact string replacements in files.",
                                 conv.tools[1].parameters)


def test_developer_role_reasoning_alias_legacy_fields_and_placeholders():
    body = {
        "model": "m",
        "messages": [
            {"role": "developer", "content": [{"type": "text", "text": "Be brief."}]},
            {"role": "user", "content": [{"type": "text", "text": "look"},
                                         {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA"}}]},
            {"role": "assistant", "content": None, "reasoning": "hmm"},
        ],
        "max_completion_tokens": 7, "max_tokens": 99, "stop": "END", "seed": 3, "top_k": 20,
        "tools": [{"type": "custom", "custom": {"name": "x"}}],
    }
    conv = chat.parse_request(body, "/v1/chat/completions")
    assert conv.messages[0] == Message("system", "Be brief.")
    assert conv.messages[1].content == "look\n[image_url omitted: this model reads text only]"
    assert conv.messages[2] == Message("assistant", "", "hmm")
    assert conv.sampling == Sampling(max_tokens=7, stop=("END",), seed=3, top_k=20)
    assert conv.tools == ()
    assert chat.encoder_options(body) == {"include_usage": False}


@pytest.mark.parametrize(
    "body, needle",
    [
        ([], "request body must be an object"),
        ({"messages": [{"role": "user", "content": "x"}]}, "model"),
        ({"model": "m"}, "messages must be an array"),
        ({"model": "m", "messages": []}, "must not be empty"),
        ({"model": "m", "messages": [{"role": "wizard", "content": "x"}]}, "'wizard'"),
        ({"model": "m", "messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
        ({"model": "m", "messages": [{"role": "user", "content": [{"type": "video"}]}]}, "'video'"),
        ({"model": "m", "messages": [{"role": "user", "content": "x"}], "temperature": "hot"}, "temperature"),
        ({"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": True}, "max_tokens"),
        ({"model": "m", "messages": [{"role": "user", "content": "x"}], "stop": [1]}, "stop"),
        ({"model": "m", "messages": [{"role": "user", "content": "x"}], "n": 2}, "n > 1"),
        ({"model": "m", "messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "f"}}]}]}, "id"),
    ],
)
def test_malformed_requests_are_400(body, needle):
    with pytest.raises(ProviderError) as err:
        chat.parse_request(body, "/v1/chat/completions")
    assert err.value.status == 400 and needle in err.value.message


def _client(answer) -> openai.OpenAI:
    return openai.OpenAI(api_key="polar-token", base_url=f"{BASE_URL}/v1", http_client=mock_http(answer), max_retries=0)


@pytest.mark.parametrize("scenario", sorted(REPLIES))
def test_render_parses_in_sdk_and_stream_accumulates_to_the_same(scenario):
    c = completion_for(scenario, "chatcmpl-9f2e")
    rendered = chat.render_response(c)
    plain = ChatCompletion.model_validate(rendered)
    message = plain.choices[0].message
    assert (message.content or "", getattr(message, "reasoning_content", None)) == (c.content, c.reasoning)
    assert plain.choices[0].finish_reason == c.finish_reason
    assert plain.usage.total_tokens == 366

    data = stream_for(scenario, chat.StreamEncoder(c.id, c.model, include_usage=True), c)
    records = sse_payloads(data)
    assert records[-1] == (None, "[DONE]")
    for _, payload in records[:-1]:
        ChatCompletionChunk.model_validate(payload)

    client = _client(lambda body, req: sse_response(data) if body.get("stream") else httpx.Response(200, json=rendered))
    with client.chat.completions.stream(model=c.model, messages=[{"role": "user", "content": "hi"}]) as s:
        for _ in s:  # the SDK's accumulator (get_final_completion refuses finish_reason=length by design)
            pass
        final = s.current_completion_snapshot
    got = final.choices[0].message
    assert (got.content or "") == c.content
    assert getattr(got, "reasoning_content", None) == c.reasoning
    assert [(t.id, t.function.name, t.function.arguments) for t in got.tool_calls or []] == [
        (t.id, t.function.name, t.function.arguments) for t in message.tool_calls or []]
    assert final.choices[0].finish_reason == plain.choices[0].finish_reason
    assert final.usage.model_dump() == plain.usage.model_dump()


def test_usage_chunk_only_when_asked():
    c = completion_for("text_only", "chatcmpl-1")
    without = sse_payloads(stream_for("text_only", chat.StreamEncoder(c.id, c.model), c))
    assert all("usage" not in p for _, p in without[:-1])
    first = without[0][1]["choices"][0]["delta"]
    assert first == {"role": "assistant", "content": ""}


@pytest.mark.parametrize("scenario", sorted(REPLIES))
def test_round_trip_through_the_harness(scenario):
    body = load_request("qwen_chat_turn2.json")
    c = completion_for(scenario, "chatcmpl-77aa")
    message = chat.render_response(c)["choices"][0]["message"]
    resent = json.loads(json.dumps(message))
    body["messages"] += [resent] + [
        {"role": "tool", "tool_call_id": t.id, "content": "ok"} for t in c.tool_calls]
    conv = chat.parse_request(body, "/v1/chat/completions")
    n = 6
    assert conv.messages[n] == expected_assistant(c)
    assert [(m.tool_call_id, m.name) for m in conv.messages[n + 1:]] == [(t.id, t.name) for t in c.tool_calls]


def test_errors_reach_the_sdk_as_its_own_exceptions():
    cases = [(ProviderError(400, "messages must not be empty"), openai.BadRequestError, "invalid_request_error"),
             (ProviderError(401, "unknown credentials"), openai.AuthenticationError, "authentication_error"),
             (ProviderError(503, "engine down"), openai.InternalServerError, "server_error")]
    for err, exc_type, kind in cases:
        client = _client(lambda body, req, err=err: httpx.Response(err.status, json=chat.render_error(err)))
        with pytest.raises(exc_type) as caught:
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        assert caught.value.type == kind and err.message in str(caught.value)


def test_error_mid_stream_raises_in_sdk():
    enc = chat.StreamEncoder("chatcmpl-1", "m")
    data = enc.start() + enc.fail(ProviderError(503, "engine went away"))
    client = _client(lambda body, req: sse_response(data))
    with pytest.raises(openai.APIError, match="engine went away"):
        for _ in client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], stream=True):
            pass


def test_models_list_parses_in_sdk():
    client = _client(lambda body, req: httpx.Response(200, json=chat.render_models(["polar-tiny", "other"])))
    assert [m.id for m in client.models.list()] == ["polar-tiny", "other"]
    Model.model_validate(chat.render_models(["x"])["data"][0])


def test_codec_registry():
    assert set(CODECS) == {"openai_chat", "openai_responses", "anthropic", "gemini"}
    assert codec("openai_chat") is chat
    with pytest.raises(ValueError):
        codec("cohere")
