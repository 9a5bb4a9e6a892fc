"""OpenAI Responses codec, checked against the openai SDK's models, event types and stream state."""
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
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from polar_mitm.conversation import (
    Completion,
    ContentDelta,
    Message,
    ProviderError,
    ReasoningDelta,
    Sampling,
    ToolCall,
    ToolCallDone,
)
from polar_mitm.providers import openai_responses as responses

EVENT = TypeAdapter(ResponseStreamEvent)


def test_codex_request():
    conv = responses.parse_request(load_request("codex_responses_turn2.json"), "/v1/responses")
    assert (conv.api, conv.model, conv.stream, conv.sampling) == ("openai_responses", "polar-tiny", True, Sampling())
    system, env, prompt, turn, result = conv.messages
    assert system.role == "system" and system.content.startswith("You are Codex")
    assert system.content.endswith("Approval policy: never.\n</permissions instructions>")
    assert env.content.startswith("<environment_context>")
    assert prompt == Message("user", "Fix the failing test in test_math.py")
    # an encrypted_content Polar did not make (a hand-written stand-in for a provider's): the summary is the reasoning
    assert turn == Message(
        "assistant", "", "**Running the tests**\n\nI will run the test suite first.",
        (ToolCall("call_Ab12Cd34", "shell", '{"command": ["bash", "-lc", "pytest -q"], "workdir": "/work/task"}'),),
    )
    assert result.role == "tool" and (result.tool_call_id, result.name) == ("call_Ab12Cd34", "shell")
    assert json.loads(result.content)["metadata"]["exit_code"] == 1
    # custom apply_patch offered as a function of one string (its grammar in the description); web_search dropped
    assert [t.name for t in conv.tools] == ["shell", "update_plan", "apply_patch"]
    assert conv.tools[2].parameters["required"] == ["input"]


def test_pi_request_reasoning_comes_back_from_encrypted_content():
    conv = responses.parse_request(load_request("pi_responses_turn2.json"), "/v1/responses")
    system, user, turn, result = conv.messages
    assert system.role == "system"
    assert system.content == "You are an expert coding assistant operating inside pi, a coding agent harness."
    assert user == Message("user", "Why does test_add fail?")
    assert turn.reasoning == "The test expects add(2, 2) == 4; add() subtracts. I will read math_utils.py."
    assert turn.content == "Let me read the implementation."
    assert turn.tool_calls == (ToolCall("call_7_0", "read", '{"path": "math_utils.py"}'),)
    assert result == Message("tool", "def add(a, b):\n    return a - b\n", tool_call_id="call_7_0", name="read")
    assert conv.sampling.max_tokens == 4096


def test_string_input_custom_calls_and_placeholders():
    body = {"model": "m", "instructions": "Be brief.", "input": "hello", "temperature": 0.2, "top_p": 0.9}
    conv = responses.parse_request(body, "/v1/responses")
    assert conv.messages == (Message("system", "Be brief."), Message("user", "hello"))
    body = {"model": "m", "input": [
        {"role": "user", "content": [{"type": "input_text", "text": "see"}, {"type": "input_image", "image_url": "x"}]},
        {"type": "custom_tool_call", "call_id": "c1", "name": "apply_patch", "input": "*** Begin Patch"},
        {"type": "custom_tool_call_output", "call_id": "c1", "output": "Done"},
    ]}
    user, turn, result = responses.parse_request(body, "/v1/responses").messages
    assert user.content == "see\n[input_image omitted: this model reads text only]"
    assert turn.tool_calls[0].args() == {"input": "*** Begin Patch"}
    assert (result.name, result.content) == ("apply_patch", "Done")


@pytest.mark.parametrize(
    "body, needle",
    [
        ({"input": "x"}, "model"),
        ({"model": "m"}, "input must be an array"),
        ({"model": "m", "input": []}, "must not be empty"),
        ({"model": "m", "input": "x", "previous_response_id": "resp_1"}, "previous_response_id"),
        ({"model": "m", "input": [{"type": "item_reference", "id": "x"}]}, "'item_reference'"),
        ({"model": "m", "input": [{"role": "critic", "content": "x"}]}, "'critic'"),
        ({"model": "m", "input": [{"type": "function_call", "name": "f", "arguments": "{}"}]}, "call_id"),
        ({"model": "m", "input": "x", "max_output_tokens": "9"}, "max_output_tokens"),
        ({"model": "m", "input": "x", "instructions": ["a"]}, "instructions"),
    ],
)
def test_malformed_requests_are_400(body, needle):
    with pytest.raises(ProviderError) as err:
        responses.parse_request(body, "/v1/responses")
    assert err.value.status == 400 and needle in err.value.message


def _client(answer) -> openai.OpenAI:
    return openai.OpenAI(api_key="polar-token", base_url=f"{BASE_URL}/v1", http_client=mock_http(answer), max_retries=0)


def _comparable(output: list) -> list:
    return [item.model_dump(exclude_none=True) for item in output]


@pytest.mark.parametrize("scenario", sorted(REPLIES))
def test_render_parses_in_sdk_and_stream_builds_the_same_response(scenario):
    c = completion_for(scenario, "resp_0c1d")
    rendered = responses.render_response(c)
    plain = Response.model_validate(rendered)
    assert plain.output_text == c.content
    assert plain.usage.input_tokens == 321 and plain.usage.output_tokens == 45
    if c.finish_reason == "length":
        assert (plain.status, plain.incomplete_details.reason) == ("incomplete", "max_output_tokens")
    else:
        assert (plain.status, plain.incomplete_details) == ("completed", None)

    data = stream_for(scenario, responses.StreamEncoder(c.id, c.model, prompt_tokens=321), c)
    records = sse_payloads(data)
    assert [p["sequence_number"] for _, p in records] == list(range(len(records)))
    assert all(name == p["type"] for name, p in records)
    assert [p["type"] for _, p in records][:2] == ["response.created", "response.in_progress"]
    assert records[-1][0] == "response.completed"
    for _, payload in records:
        EVENT.validate_python(payload)
    done_items = [p["item"] for _, p in records if p["type"] == "response.output_item.done"]
    assert done_items == records[-1][1]["response"]["output"]

    client = _client(lambda body, req: sse_response(data) if body.get("stream") else httpx.Response(200, json=rendered))
    text = ""
    with client.responses.stream(model=c.model, input="hi") as s:
        for event in s:
            text += event.delta if event.type == "response.output_text.delta" else ""
        final = s.get_final_response()
    assert text == c.content
    assert _comparable(final.output) == _comparable(plain.output)
    assert final.status == plain.status and final.usage == plain.usage
    again = client.responses.create(model=c.model, input="hi")
    assert _comparable(again.output) == _comparable(plain.output)


@pytest.mark.parametrize("scenario", sorted(REPLIES))
@pytest.mark.parametrize("keep", ["everything", "artefact_only"])
def test_round_trip_through_the_harness(scenario, keep):
    body = load_request("codex_responses_turn2.json")
    c = completion_for(scenario, "resp_51ab")
    items = json.loads(json.dumps(responses.render_response(c)["output"]))
    for item in items:
        item.pop("id")
        item.pop("status", None)
        if keep == "artefact_only" and item["type"] == "reasoning":
            item["summary"] = []  # codex/pi re-send only encrypted_content: the reasoning must survive
    body["input"] += items + [{"type": "function_call_output", "call_id": t.id, "output": "ok"} for t in c.tool_calls]
    conv = responses.parse_request(body, "/v1/responses")
    assert conv.messages[5] == expected_assistant(c)
    assert [(m.tool_call_id, m.name) for m in conv.messages[6:]] == [(t.id, t.name) for t in c.tool_calls]


def test_interleaved_reasoning_opens_a_new_item_and_parses_back_as_one_turn():
    c = Completion("resp_x", "m", "A", "r1\nr2", (), "stop", 1, 1)
    enc = responses.StreamEncoder(c.id, c.model)
    data = enc.start() + enc.feed(ReasoningDelta("r1")) + enc.feed(ContentDelta("A")) + enc.feed(
        ReasoningDelta("r2")) + enc.finish(c)
    output = sse_payloads(data)[-1][1]["response"]["output"]
    assert [i["type"] for i in output] == ["reasoning", "message", "reasoning"]
    body = {"model": "m", "input": [{"role": "user", "content": "q"}, *output]}
    conv = responses.parse_request(body, "/v1/responses")
    assert conv.messages[-1] == Message("assistant", "A", "r1\nr2")


# codex 0.171's default model: its tools in an `additional_tools` input item, namespaced, `exec` free-form (raw
# text input with a grammar), beside a plain function; before, the proxy answered 400 for the item type
DEFAULT_MODEL_BODY = {"model": "gpt-5.4-codex", "stream": True, "input": [
    {"type": "additional_tools", "role": "developer", "tools": [{"type": "namespace", "name": "functions", "tools": [
        {"type": "custom", "name": "exec", "description": "Runs a shell command.",
         "format": {"type": "grammar", "syntax": "lark", "definition": "start: /.+/"}},
        {"type": "function", "name": "update_plan", "description": "Plan.", "parameters": {"type": "object"}}]}]},
    {"role": "user", "content": [{"type": "input_text", "text": "list the files"}]},
    {"type": "custom_tool_call", "call_id": "c0", "name": "exec", "input": "pwd"},
    {"type": "custom_tool_call_output", "call_id": "c0", "output": "/work"},
], "tools": [{"type": "web_search"}]}


def test_additional_tools_namespaces_and_custom_tools_are_offered():
    conv = responses.parse_request(DEFAULT_MODEL_BODY, "/v1/responses")
    exec_tool, plan = conv.tools
    assert (exec_tool.name, plan.name) == ("exec", "update_plan")
    assert exec_tool.description == "Runs a shell command.\n\nThe input follows this lark grammar:\nstart: /.+/"
    assert exec_tool.parameters["properties"]["input"]["type"] == "string"
    user, turn, result = conv.messages
    assert user == Message("user", "list the files") and turn.tool_calls[0].args() == {"input": "pwd"}
    assert (result.name, result.content) == ("exec", "/work")
    assert responses.encoder_options(DEFAULT_MODEL_BODY) == {"custom_tools": frozenset({"exec"})}
    assert responses.encoder_options({"model": "m", "input": "x"}) == {}


def test_a_custom_tool_call_goes_back_as_the_sdk_reads_it():
    """The model called `exec` (offered as a function of `input`): a custom_tool_call item with the raw text, in
    the response and the stream alike, which the SDK parses and the next request parses back."""
    calls = (ToolCall("call_1", "exec", '{"input": "ls -la"}'), ToolCall("call_2", "update_plan", '{"plan": []}'))
    c = Completion("resp_c1", "m", "", None, calls, "tool_calls", 10, 5)
    options = responses.encoder_options(DEFAULT_MODEL_BODY)
    rendered = responses.render_response(c, **options)
    plain = Response.model_validate(rendered)
    assert [(i.type, getattr(i, "input", None)) for i in plain.output] == [("custom_tool_call", "ls -la"),
                                                                           ("function_call", None)]
    enc = responses.StreamEncoder(c.id, c.model, **options)
    data = enc.start() + b"".join(enc.feed(ToolCallDone(i, call)) for i, call in enumerate(calls)) + enc.finish(c)
    records = sse_payloads(data)
    for _, payload in records:
        EVENT.validate_python(payload)
    assert [p["delta"] for _, p in records if p["type"] == "response.custom_tool_call_input.delta"] == ["ls -la"]
    assert records[-1][1]["response"]["output"] == rendered["output"]
    body = {**DEFAULT_MODEL_BODY, "input": [*DEFAULT_MODEL_BODY["input"], *[
        {k: v for k, v in item.items() if k not in ("id", "status")} for item in rendered["output"]]]}
    assert responses.parse_request(body, "/v1/responses").messages[-1].tool_calls == calls


def test_errors_reach_the_sdk_as_its_own_exceptions():
    err = ProviderError(400, "input must not be empty")
    client = _client(lambda body, req: httpx.Response(400, json=responses.render_error(err)))
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(model="m", input="hi")
    assert caught.value.type == "invalid_request_error" and "input must not be empty" in str(caught.value)


def test_error_mid_stream_is_response_failed():
    enc = responses.StreamEncoder("resp_1", "m")
    data = enc.start() + enc.feed(ContentDelta("par")) + enc.fail(
        ProviderError(503, "engine went away"))
    records = sse_payloads(data)
    failed = records[-1][1]
    assert failed["type"] == "response.failed"
    EVENT.validate_python(failed)
    assert failed["response"]["error"] == {"code": "server_error", "message": "engine went away"}
    assert [i["type"] for i in failed["response"]["output"]] == ["message"]


def test_models_list_is_the_openai_one():
    client = _client(lambda body, req: httpx.Response(200, json=responses.render_models(["polar-tiny"])))
    assert [m.id for m in client.models.list()] == ["polar-tiny"]
