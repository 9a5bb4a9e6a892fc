"""The Mistral family against Mistral's own reference (issue 45): mistral-common's real Tekken tokenizer, converted
for Hugging Face with the chat template mistral-common writes for it (tests/mistral_reference.py), in its own
format (v3: NeMo) and in the later ones mistral-common defines (v7: Small 3's [SYSTEM_PROMPT]; v11: Devstral's
`[TOOL_CALLS]NAME[CALL_ID]ID[ARGS]{…}`; v13: Magistral's, with [THINK]). For each, the proxy reads it as Mistral,
its prompts for OpenAI chat requests (tools, calls, results, several turns) are the very ids mistral-common
encodes, and a tool call as mistral-common writes a past one parses back through the tokenizer."""
from __future__ import annotations

import json

import pytest

from polar_mitm.providers import openai_chat
from polar_mitm.tokens.model import load_model
from tests.mistral_reference import mistral_common, write_hf_tokenizer
from tests.polar_mitm.tokens.test_reply_families import stream_ids

BASH = {"type": "function", "function": {"name": "bash", "description": "Run a shell command.", "parameters": {
    "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}
READ = {"type": "function", "function": {"name": "read", "description": "Read a file.", "parameters": {
    "type": "object", "properties": {"path": {"type": "string"}, "lines": {"type": "array"}}}}}


def call(id_: str, name: str, args: dict) -> dict:
    """A past call as the OpenAI API carries it (Mistral's ids are 9 letters or digits)."""
    return {"id": id_, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}


ASK = {"role": "user", "content": "List the files, then read ü.py."}
CALLS = {"role": "assistant", "content": None, "tool_calls": [call("a1b2c3d4e", "bash", {"command": "ls -la"}),
                                                              call("f5g6h7i8j", "read", {"path": "ü.py", "lines": [1, 2]})]}
RESULTS = [{"role": "tool", "tool_call_id": "a1b2c3d4e", "content": "ü.py\nsetup.cfg"},
           {"role": "tool", "tool_call_id": "f5g6h7i8j", "content": "print('hi')"}]
CHATS = {
    "plain": ([{"role": "user", "content": "Hello."}, {"role": "assistant", "content": "Hi. What now?"},
               {"role": "user", "content": "Nothing."}], None),
    "system and tools": ([{"role": "system", "content": "Be brief."}, ASK], [BASH, READ]),
    "two calls, their results": ([{"role": "system", "content": "Be brief."}, ASK, CALLS, *RESULTS], [BASH, READ]),
    "then the answer and a new ask": ([ASK, CALLS, *RESULTS, {"role": "assistant", "content": "Two files."},
                                       {"role": "user", "content": "Thanks. Now run it."}], [BASH, READ]),
}


VERSIONS = [None, "v7", "v11", "v13"]  # None: the file's own, v3


@pytest.fixture(scope="module", params=VERSIONS, ids=lambda v: v or "v3")
def tekken(request, tmp_path_factory):
    return request.param, write_hf_tokenizer(tmp_path_factory.mktemp("mistral") / "tekken", request.param)


def test_the_tekken_tokenizer_reads_as_mistral(tekken):
    version, folder = tekken
    model = load_model(str(folder))
    # v11's template writes reasoning as plain <think>…</think> text, v13's (Magistral) in [THINK] tokens
    reasoning = {"v11": "think", "v13": "mistral"}.get(version or "")
    assert (model.family, model.tool_parser, model.reasoning_parser) == ("Mistral", "mistral", reasoning)
    assert model.template_drops == frozenset()  # tools, calls and results all reach the model


def test_the_proxys_prompts_are_mistral_commons_ids(tekken):
    version, folder = tekken
    model = load_model(str(folder))
    chats = list(CHATS.values())
    reference = mistral_common([{"messages": m, "tools": t} for m, t in chats], version)
    for (name, (messages, tools)), ids, text in zip(CHATS.items(), reference["tokens"], reference["texts"]):
        body = {"model": "m", "messages": messages, **({"tools": tools} if tools else {})}
        conv = openai_chat.parse_request(body)  # the proxy's own path: the request as the harness sent it
        rendered = model.renderer.render_full(conv, remember=False)
        assert rendered == ids, f"{name}: the proxy renders\n{model.tokenizer.decode(rendered)}\nmistral-common\n{text}"


def test_a_past_call_as_mistral_common_writes_it_parses_back(tekken):
    """The tokens mistral-common adds for the assistant's two calls are what a Mistral model samples: through the
    detokenizer, id by id, they parse into the two calls (with the ids written, where the format writes them)."""
    version, folder = tekken
    messages, tools = [ASK, CALLS, RESULTS[0]], [BASH, READ]
    before, after = mistral_common([{"messages": messages[:1], "tools": tools},
                                    {"messages": messages, "tools": tools}], version)["tokens"]
    model = load_model(str(folder))
    end = after.index(model.tokenizer.eos_token_id, len(before))
    assert after[: len(before)] == before  # the history is an append
    sampled = model.tokenizer.decode(after[len(before):end], skip_special_tokens=False)
    ids, reply = stream_ids(model.tokenizer, sampled, "mistral", model.reasoning_parser)
    assert ids == after[len(before):end]
    if version == "v13":  # no ids written: the proxy's own, 9 letters and digits as Mistral's templates want
        assert all(len(c.id) == 9 and c.id.isalnum() for c in reply.tool_calls), reply.tool_calls
    else:  # v3/v7 write the ids in the list, v11 after [CALL_ID]: kept
        assert [c.id for c in reply.tool_calls] == ["a1b2c3d4e", "f5g6h7i8j"]
    assert [(c.name, c.args()) for c in reply.tool_calls] == [("bash", {"command": "ls -la"}),
                                                              ("read", {"path": "ü.py", "lines": [1, 2]})]
    assert (reply.content, reply.flags) == ("", ())
