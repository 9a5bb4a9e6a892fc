"""Engine-side rendering (`polar proxy --render engine`, issue 45 item 4) through a real mitmdump against the
reference server's chat endpoint: the official SDKs of each API, streamed and not, get the engine's parsed tool
call and reply; every record is the engine's own prompt and sampled ids (`rendered:engine`), exact against its
token API, holding every text the harness sent; the tool turn re-renders as sampled, so the session still merges
into one chain by token prefix. A model whose template Polar does not parse (the real Gemma 3 tokenizer with a
template that renders tools its own way) is refused in proxy mode and served in engine mode."""
from __future__ import annotations

import itertools
import json
import subprocess
import sys

import httpx
import pytest
from transformers import AutoTokenizer

from polar_mitm.launch import free_port, stop
from polar_traj.build import BuildConfig, build_session
from polar_traj.reading import CapturedSession, SessionFile
from polar_traj.records import CallRecord
from tests.polar_mitm.conftest import start_proxy
from tests.polar_mitm.sdk_clients import CLIENTS, Way
from tests.polar_mitm.test_proxy_real_templates import assert_exact, two_turn_chat
from tests.polar_mitm.tokens.test_family import GEMMA_WITH_TOOLS
from tests.polar_mitm.tokens.test_reply_families import TOKENIZERS
from tests.prompt_oracle import assert_prompt_faithful

ENGINE = ("--set", "polar_render=engine")
_ids = itertools.count()


@pytest.fixture(scope="module")
def engine_proxy(tmp_path_factory, start_reference_server, policies_dir, tiny_model_dir):
    backend = start_reference_server(policies_dir / "tool-call.yaml")
    proc, handle = start_proxy(tmp_path_factory.mktemp("engine-render"), backend, tiny_model_dir, *ENGINE)
    yield handle
    stop(proc)


def same_as_the_token_api(backend: str, record: dict) -> None:
    """The record's ids are what the engine samples from its prompt, with the model's own logprobs."""
    body = {"input_ids": record["prompt_ids"], "return_logprob": True,
            "sampling_params": {"max_new_tokens": 200, "temperature": 0, "skip_special_tokens": False}}
    engine = httpx.post(backend + "/generate", json=body, timeout=60).json()
    assert record["output_ids"] == engine["output_ids"]
    lps = [lp for lp, _, _ in engine["meta_info"]["output_token_logprobs"]]
    assert record["output_logprobs"] == pytest.approx(lps, abs=1e-5)


@pytest.mark.parametrize("api", sorted(CLIENTS))
@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_the_engines_reply_reaches_each_sdk_and_every_call_is_exact(engine_proxy, tiny_model_dir, api, stream):
    session = f"engine-{api}-{stream}-{next(_ids)}"
    turns = CLIENTS[api](Way(None, None, engine_proxy.base_url, session), stream)
    assert (turns[0].tool_name, turns[0].tool_args) == ("shell", {"command": "echo polar > polar.txt"})
    assert len(turns) == 2 and turns[1].tool_name is None and turns[1].text == "Done."
    records = engine_proxy.records(session)
    assert [r["prefix_source"] for r in records] == ["rendered:engine", "rendered:engine"]
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    for r in records:
        assert r["error"] is None and r["engine"] == engine_proxy.backend
        assert_prompt_faithful(r, tokenizer)  # for Chat calls also: the template's own rendering of the request
        same_as_the_token_api(engine_proxy.backend, r)
    merged, _stats = build_session(CapturedSession(SessionFile("local", session, None),
                                                   [CallRecord.from_dict(r) for r in records]), BuildConfig())
    (trajectory,) = merged  # the tool turn re-rendered as sampled: one chain, found by token prefix
    second = records[1]
    assert trajectory.prompt_ids + trajectory.response_ids == second["prompt_ids"] + second["output_ids"]


def test_a_family_polar_does_not_parse_is_served_by_the_engine(tmp_path, make_tiny_model, start_reference_server):
    """Refused in one line when the proxy renders, served when the engine does."""
    tokenizer_dir = TOKENIZERS / "gemma3"
    assert (tokenizer_dir / ".installed").is_file(), f"{tokenizer_dir}: run `make setup`"
    model = make_tiny_model.write_for_tokenizer(tokenizer_dir, tmp_path / "tiny-gemma3")
    config = json.loads((model / "tokenizer_config.json").read_text())
    config["chat_template"] = GEMMA_WITH_TOOLS + "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
    (model / "tokenizer_config.json").write_text(json.dumps(config))
    backend = start_reference_server(None, model)
    refused = subprocess.run([sys.executable, "-m", "polar.cli", "proxy", "--tokenizer", str(model), "--backend",
                              backend, "--proxy-port", str(free_port()), "--base-url-port", str(free_port()),
                              "--confdir", str(tmp_path / "mitm")], capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
    assert "Gemma 3's" in refused.stderr and "--render engine" in refused.stderr  # the way out, named
    proc, proxy = start_proxy(tmp_path / "proxy", backend, model, *ENGINE)
    try:
        records = two_turn_chat(proxy, "gemma3-engine")
    finally:
        stop(proc)
    assert [r["prefix_source"] for r in records] == ["rendered:engine", "rendered:engine"]
    assert_exact(records, AutoTokenizer.from_pretrained(str(model)), backend)
