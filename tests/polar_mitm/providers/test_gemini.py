"""Gemini codec, checked against google-genai's models and its streaming client."""
from __future__ import annotations

import json

import httpx
import pytest
from google import genai
from google.genai import errors as genai_errors
from google.genai import types

from polar_mitm.conversation import (
    Completion,
    ContentDelta,
    Message,
    ProviderError,
    ReasoningDelta,
    Sampling,
    ToolCall,
)
from polar_mitm.providers import gemini as codec
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

STREAM_PATH = "/v1beta/models/gemini-2.5-pro:streamGenerateContent?alt=sse"


def test_gemini_cli_request():
    fixture = load_request("gemini_cli_turn2.json")
    conv = codec.parse_request(fixture["body"], fixture["path"])
    assert (conv.api, conv.model, conv.stream) == ("gemini", "gemini-2.5-pro", True)
    assert conv.sampling == Sampling(temperature=0.0, top_p=1.0)
    system, context, ack, prompt, turn, result = conv.messages
    assert system == Message("system", "You are an interactive CLI agent specializing in software engineering tasks.")
    assert (context.role, ack, prompt.content) == (
        "user", Message("assistant", "Got it. Thanks for the context!"), "Fix the failing test in test_math.py")
    # Google's own signature is opaque to us, and the call had no id: a positional id is made up,
    # and the response (whose id gemini-cli invented) is matched to the call by name.
    assert turn == Message("assistant", "I'll run the tests first.", None, (
        ToolCall("call_3_0", "run_shell_command", '{"command": "pytest -q", "description": "Run the test suite"}'),))
    assert result == Message("tool", "Command: pytest -q\nStdout: F.\n1 failed, 1 passed\nExit Code: 1",
                             tool_call_id="call_3_0", name="run_shell_command")
    shell, read = conv.tools
    assert shell.parameters["required"] == ["command"]
    assert read.parameters == {"type": "object", "properties": {"absolute_path": {"type": "string"}},
                               "required": ["absolute_path"]}  # OpenAPI type names lower-cased; googleSearch dropped


def test_paths_snake_case_and_count_tokens():
    body = {"contents": [{"parts": [{"text": "a"}, {"inline_data": {"mime_type": "image/png", "data": "AA"}}]}],
            "system_instruction": "Be brief.",
            "generation_config": {"max_output_tokens": 9, "top_k": 4, "stop_sequences": ["X"], "seed": 1}}
    conv = codec.parse_request(body, "/v1beta/models/polar%2Dtiny:generateContent")
    assert (conv.model, conv.stream) == ("polar-tiny", False)
    assert conv.messages == (Message("system", "Be brief."),
                             Message("user", "a\n[inline_data omitted: this model reads text only]"))
    assert conv.sampling == Sampling(max_tokens=9, top_k=4, stop=("X",), seed=1)
    inner = {"model": "models/other", "contents": [{"role": "user", "parts": [{"text": "hi"}]}]}
    wrapped = {"generateContentRequest": inner}
    assert codec.parse_request(wrapped, "/v1beta/models/x:countTokens").model == "other"
    assert codec.render_count_tokens(12) == {"totalTokens": 12}
    types.CountTokensResponse.model_validate(codec.render_count_tokens(12))


def test_function_responses_match_ids_then_names():
    body = {"contents": [
        {"role": "user", "parts": [{"text": "go"}]},
        {"role": "model", "parts": [{"functionCall": {"id": "c1", "name": "f", "args": {}}},
                                    {"functionCall": {"name": "g", "args": {"x": 1}}},
                                    {"functionCall": {"name": "f", "args": {"y": 2}}}]},
        {"role": "user", "parts": [{"functionResponse": {"name": "f", "response": {"result": {"n": 1}}}},
                                   {"functionResponse": {"id": "c1", "name": "f", "response": {"output": "one"}}},
                                   {"functionResponse": {"id": "made-up", "name": "g", "response": {"error": "boom"}}},
                                   {"text": "thanks"}]},
    ]}
    msgs = codec.parse_request(body, STREAM_PATH).messages
    assert [c.id for c in msgs[1].tool_calls] == ["c1", "call_1_1", "call_1_2"]
    assert [(m.role, m.tool_call_id, m.content) for m in msgs[2:]] == [
        ("tool", "call_1_2", '{"result": {"n": 1}}'), ("tool", "c1", "one"), ("tool", "call_1_1", "boom"),
        ("user", None, "thanks")]


@pytest.mark.parametrize(
    "path, body, needle",
    [
        ("/v1beta/models/m:embedContent", {"contents": []}, "unsupported Gemini path"),
        ("/v1/chat/completions", {}, "unsupported Gemini path"),
        (STREAM_PATH, {}, "contents must be an array"),
        (STREAM_PATH, {"contents": []}, "must not be empty"),
        (STREAM_PATH, {"contents": [{"role": "system", "parts": [{"text": "x"}]}]}, "'system'"),
        (STREAM_PATH, {"contents": [{"parts": [{"executableCode": {}}]}]}, "executableCode"),
        (STREAM_PATH, {"contents": [{"parts": [{"text": 1}]}]}, ".text"),
        (STREAM_PATH, {"contents": [{"parts": [{"text": "x"}]}], "generationConfig": {"topK": "5"}}, "topK"),
        (STREAM_PATH, {"contents": [{"role": "model", "parts": [{"functionCall": {"args": {}}}]}]}, "name"),
    ],
)
def test_malformed_requests_are_400(path, body, needle):
    with pytest.raises(ProviderError) as err:
        codec.parse_request(body, path)
    assert err.value.status == 400 and needle in err.value.message


def _client(answer) -> genai.Client:
    options = types.HttpOptions(base_url=BASE_URL, httpx_client=mock_http(answer),
                                retry_options=types.HttpRetryOptions(attempts=1))
    return genai.Client(api_key="polar-token", http_options=options)


def _resend(parts: list[types.Part]) -> list[dict]:
    """Parts as a harness sends them back (JSON, camelCase, signatures base64 again)."""
    return [p.model_dump(mode="json", by_alias=True, exclude_none=True) for p in parts]


def _consolidate(parts: list[dict]) -> list[dict]:
    """What gemini-cli keeps of a stream: adjacent text parts of the same kind concatenated."""
    out: list[dict] = []
    for part in parts:
        last = out[-1] if out else None
        if last and "text" in last and "text" in part and last.get("thought") == part.get("thought"):
            last["text"] += part["text"]
            if "thoughtSignature" in part:
                last["thoughtSignature"] = part["thoughtSignature"]
        else:
            out.append(dict(part))
    return out


def _as_model_turn(parts: list[dict]) -> Message:
    body = {"contents": [{"role": "user", "parts": [{"text": "q"}]}, {"role": "model", "parts": parts}]}
    return codec.parse_request(body, STREAM_PATH).messages[-1]


@pytest.mark.parametrize("scenario", sorted(REPLIES))
def test_render_parses_in_sdk_and_stream_carries_the_same(scenario):
    c = completion_for(scenario, "resp_0a1b")
    rendered = codec.render_response(c)
    plain = types.GenerateContentResponse.model_validate(rendered)
    finish = "MAX_TOKENS" if c.finish_reason == "length" else "STOP"
    assert plain.candidates[0].finish_reason == finish
    assert plain.usage_metadata.total_token_count == 366
    assert _as_model_turn(_resend(plain.candidates[0].content.parts)) == expected_assistant(c)

    data = stream_for(scenario, codec.StreamEncoder(c.id, c.model, prompt_tokens=321), c)
    for _, payload in sse_payloads(data):
        types.GenerateContentResponse.model_validate(payload)
    client = _client(lambda body, req: sse_response(data) if "stream" in req.url.path
                     else httpx.Response(200, json=rendered))
    chunks = list(client.models.generate_content_stream(model=c.model, contents="hi"))
    assert [ch.candidates[0].finish_reason for ch in chunks][-1] == finish
    assert all(ch.candidates[0].finish_reason is None for ch in chunks[:-1])
    assert chunks[-1].usage_metadata == plain.usage_metadata
    streamed = [p for ch in chunks for p in ch.candidates[0].content.parts]
    assert _as_model_turn(_consolidate(_resend(streamed))) == expected_assistant(c)
    again = client.models.generate_content(model=c.model, contents="hi")
    assert again.candidates[0].content == plain.candidates[0].content


@pytest.mark.parametrize("scenario", sorted(REPLIES))
@pytest.mark.parametrize("keep", ["everything", "no_thought_parts"])
def test_round_trip_through_the_harness(scenario, keep):
    fixture = load_request("gemini_cli_turn2.json")
    c = completion_for(scenario, "resp_9c8d")
    parts = json.loads(json.dumps(codec.render_response(c)["candidates"][0]["content"]["parts"]))
    if keep == "no_thought_parts":  # harnesses drop thought parts; the signature must bring the reasoning back
        parts = [p for p in parts if not p.get("thought")]
    contents = fixture["body"]["contents"]
    contents.append({"role": "model", "parts": parts})
    if c.tool_calls:
        contents.append({"role": "user", "parts": [
            {"functionResponse": {"id": t.id, "name": t.name, "response": {"output": "ok"}}} for t in c.tool_calls]})
    conv = codec.parse_request(fixture["body"], fixture["path"])
    assert conv.messages[6] == expected_assistant(c)
    assert [(m.tool_call_id, m.name) for m in conv.messages[7:]] == [(t.id, t.name) for t in c.tool_calls]


def test_signature_goes_on_first_call_else_text_else_empty_part():
    parts = lambda c: codec.render_response(c)["candidates"][0]["content"]["parts"]  # noqa: E731
    call = ToolCall("c", "f", "{}")
    with_call = parts(Completion("r", "m", "A", "R", (call, call), "tool_calls", 1, 1))
    assert ["thoughtSignature" in p for p in with_call] == [False, False, True, False]
    assert ["thoughtSignature" in p for p in parts(Completion("r", "m", "A", "R", (), "stop", 1, 1))] == [False, True]
    only = parts(Completion("r", "m", "", "R", (), "length", 1, 1))
    assert only == [{"text": "R", "thought": True}, {"text": "", "thoughtSignature": encode_reasoning("R")}]


def test_stream_interleaved_events():
    c = Completion("r", "m", "A", "r1r2", (), "stop", 1, 1)
    enc = codec.StreamEncoder(c.id, c.model)
    data = enc.start() + enc.feed(ReasoningDelta("r1")) + enc.feed(ContentDelta("A")) + enc.feed(
        ReasoningDelta("r2")) + enc.finish(c)
    parts = [p for _, payload in sse_payloads(data) for p in payload["candidates"][0]["content"]["parts"]]
    assert parts[-1] == {"text": "", "thoughtSignature": encode_reasoning("r1r2")}
    assert _as_model_turn(parts) == Message("assistant", "A", "r1r2")


@pytest.mark.parametrize(
    "err, status",
    [(ProviderError(400, "contents must not be empty"), "INVALID_ARGUMENT"),
     (ProviderError(401, "unknown credentials"), "UNAUTHENTICATED"),
     (ProviderError(503, "engine down"), "UNAVAILABLE")],
)
def test_errors_reach_the_sdk_as_its_own_exceptions(err, status):
    client = _client(lambda body, req: httpx.Response(err.status, json=codec.render_error(err)))
    expected = genai_errors.ClientError if err.status < 500 else genai_errors.ServerError
    with pytest.raises(expected) as caught:
        client.models.generate_content(model="m", contents="hi")
    assert (caught.value.code, caught.value.status, caught.value.message) == (err.status, status, err.message)


def test_models_list_and_get_parse_in_sdk():
    def answer(body, req):
        listing = req.url.path.endswith("/models")
        return httpx.Response(200, json=codec.render_models(["polar-tiny"]) if listing else codec.render_model("polar-tiny"))

    client = _client(answer)
    assert [m.name for m in client.models.list()] == ["models/polar-tiny"]
    got = client.models.get(model="polar-tiny")
    assert got.name == "models/polar-tiny" and "generateContent" in got.supported_actions
