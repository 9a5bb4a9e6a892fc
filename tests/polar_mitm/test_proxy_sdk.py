"""Each provider API, streamed and not, both ways in, with the official SDKs against a real mitmdump."""
from __future__ import annotations

import itertools

import httpx
import pytest
from transformers import AutoTokenizer

from polar_mitm.launch import stop
from tests.polar_mitm.conftest import start_proxy
from tests.polar_mitm.sdk_clients import CLIENTS, Way
from tests.prompt_oracle import assert_prompt_faithful

APIS = list(CLIENTS)
_ids = itertools.count()


@pytest.fixture(scope="module")
def scripted_proxy(tmp_path_factory, start_reference_server, policies_dir, tiny_model_dir):
    backend = start_reference_server(policies_dir / "tool-call.yaml")
    proc, handle = start_proxy(tmp_path_factory.mktemp("scripted"), backend, tiny_model_dir)
    yield handle
    stop(proc)


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return AutoTokenizer.from_pretrained(str(tiny_model_dir))


def way_in(proxy, via: str, session: str) -> Way:
    if via == "https_proxy":
        return Way(proxy.proxy_url(session, "tok"), str(proxy.ca_cert), None, "tok")
    return Way(None, None, proxy.base_url, session)  # open sessions: the API key names the session


def engine_generate(backend: str, prompt_ids: list[int], max_new: int) -> dict:
    body = {"input_ids": prompt_ids, "return_logprob": True,
            "sampling_params": {"max_new_tokens": max_new, "temperature": 0, "skip_special_tokens": False}}
    return httpx.post(backend + "/generate", json=body, timeout=60).json()


@pytest.mark.parametrize("api", APIS)
@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("via", ["https_proxy", "base_url"])
def test_tool_call_round_trip_is_recorded_token_exact(scripted_proxy, tokenizer, api, stream, via):
    session = f"{api}-{via}-{'sse' if stream else 'json'}-{next(_ids)}"
    turns = CLIENTS[api](way_in(scripted_proxy, via, session), stream)
    assert turns[0].tool_name == "shell" and turns[0].tool_args == {"command": "echo polar > polar.txt"}
    assert len(turns) == 2 and turns[1].tool_name is None and turns[1].text == "Done."

    records = scripted_proxy.records(session)
    assert [r["api"] for r in records] == [api, api] and all(r["error"] is None for r in records)
    assert all(r["stream"] is stream for r in records)
    first, second = records
    assert first["prefix_source"] == "rendered:first_call"
    assert second["prefix_source"] == "substituted" and second["parent_call_id"] == first["call_id"]
    assert second["prompt_ids"][: len(first["prompt_ids"]) + len(first["output_ids"])] == \
        first["prompt_ids"] + first["output_ids"]
    for r in records:  # the prompt says what the SDK sent, and is what the engine samples from
        assert_prompt_faithful(r, tokenizer)
        engine = engine_generate(scripted_proxy.backend, r["prompt_ids"], 64)
        assert r["output_ids"] == engine["output_ids"]
        assert r["output_logprobs"] == pytest.approx([t[0] for t in engine["meta_info"]["output_token_logprobs"]],
                                                     abs=1e-6)
        assert r["response"] is not None and "authorization" not in str(r["request"]).lower()


@pytest.mark.parametrize("api", APIS)
@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_sampled_reply_equals_the_engines_greedy_tokens(proxy, tokenizer, api, stream):
    session = f"sampled-{api}-{stream}-{next(_ids)}"
    turns = CLIENTS[api](way_in(proxy, "https_proxy", session), stream, tools=False, max_tokens=12)
    (record,) = proxy.records(session)
    assert_prompt_faithful(record, tokenizer)
    engine = engine_generate(proxy.backend, record["prompt_ids"], 12)
    assert record["output_ids"] == engine["output_ids"] and len(record["output_ids"]) > 0
    assert record["output_logprobs"] == pytest.approx(
        [t[0] for t in engine["meta_info"]["output_token_logprobs"]], abs=1e-6)
    # no tools offered: the sampled text reaches the SDK whole, as plain text, and nothing is flagged
    assert turns[0].tool_name is None and record["flags"] == []
    assert turns[0].text == tokenizer.decode(record["output_ids"])
