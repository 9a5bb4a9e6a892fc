"""Tool calls and reasoning in each family's markup, through a real mitmdump (issue 45): the reference server writes
the scripted reply the way that family writes it (`polar serve --reply-format`), the proxy parses it with that
family's parser, and the official SDKs get the call and the reasoning in their own shapes, streamed and not. The
served weights are tiny-qwen2's: the markup is ordinary text to its tokenizer, so what is checked here is the path
from sampled ids to the harness; tests/polar_mitm/tokens/test_reply_families.py checks the real tokenizers."""
from __future__ import annotations

import itertools
import json

import pytest

from polar_mitm.launch import stop
from tests.polar_mitm.conftest import start_proxy
from tests.polar_mitm.sdk_clients import CLIENTS, Way

FORMATS = {"deepseek_v3": "think", "glm45": "think", "kimi_k2": "think", "mistral": "mistral",
           "llama3_json": "none", "harmony": "harmony", "tool_code": "none"}
MARKUP = ("<think>", "[THINK]", "<|channel|>", "<|message|>", "[TOOL_CALLS]", "[ARGS]", "<tool_call>", "<arg_key>",
          "<｜tool▁call▁begin｜>", "<|tool_call_begin|>", "<|python_tag|>", '"parameters"', "```tool_code")
_ids = itertools.count()


@pytest.fixture(scope="module", params=sorted(FORMATS))
def family_proxy(request, tmp_path_factory, start_reference_server, policies_dir, tiny_model_dir):
    fmt = request.param
    backend = start_reference_server(policies_dir / "tool-call.yaml", None, "--reply-format", fmt)
    proc, handle = start_proxy(tmp_path_factory.mktemp(fmt), backend, tiny_model_dir,
                               "--set", f"polar_tool_parser={fmt}", "--set", f"polar_reasoning_parser={FORMATS[fmt]}")
    yield fmt, handle
    stop(proc)


@pytest.mark.parametrize("api", ["openai_chat", "anthropic"])
@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_each_familys_call_reaches_the_harness(family_proxy, api, stream):
    fmt, proxy = family_proxy
    session = f"{fmt}-{api}-{stream}-{next(_ids)}"
    turns = CLIENTS[api](Way(None, None, proxy.base_url, session), stream)
    assert (turns[0].tool_name, turns[0].tool_args) == ("shell", {"command": "echo polar > polar.txt"})
    assert len(turns) == 2 and turns[1].tool_name is None and turns[1].text == "Done."
    first, second = proxy.records(session)
    assert first["error"] is None and second["error"] is None
    assert not any("unparsed_tool_call" in r["flags"] for r in (first, second))
    said = json.dumps(first["response"], ensure_ascii=False)  # the provider-shaped reply the harness got
    assert ("I will write the file with the shell tool." in said) == (FORMATS[fmt] != "none")  # Llama, Gemma: none
    assert not any(mark in said for mark in MARKUP), said  # no family markup leaks to the harness
    assert second["prefix_source"] == "substituted"  # the family's markup is kept in the history, token-exact
