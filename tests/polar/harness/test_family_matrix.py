"""The model-family matrix (issue 45): real harnesses on tiny models over each family's real tokenizer and chat
template. Per family the reference server writes the policy's calls the way that family's models write them
(`polar serve --reply-format`); pi (OpenAI Chat, base URL) and Claude Code (Anthropic, HTTPS_PROXY) run a
multi-turn session with reasoning where the family writes it, two parallel shell calls and then one more
(fixtures/policies/parallel-then-more.yaml; gpt-oss, which stops at each call, two calls one after the other:
shell-twice.yaml). Each run: the files written, the formats the proxy said it uses, no error and no unparsed
call, every prompt holding what the harness sent, every call's ids and logprobs those of a forward pass, the
agent's calls one merged trajectory; and the first call equals the family's own rendering of the request (for
Mistral, the ids mistral-common encodes, and for Llama 3.1 those llama-models encodes, for every call pi made;
for gpt-oss, the ids openai-harmony renders; for the others, transformers' `apply_chat_template` through the
prompt oracle). Llama 3.1's vocabulary is the one llama-models ships (tests/llama_reference.py), which has no
chat template: the proxy renders it with Polar's llama3_tools.jinja."""
from __future__ import annotations

from pathlib import Path

import pytest
from transformers import AutoTokenizer

from polar_mitm.tokens.family import OWN_TEMPLATES, TEMPLATES
from polar_traj import read as read_trajectories
from polar_traj.capture_reader import read_capture_dicts
from polar_traj.messages import conversation_messages
from tests.harmony_reference import encoding as harmony_encoding, harmony_ids
from tests.llama_reference import llama_models, write_hf_tokenizer as write_llama_tokenizer
from tests.mistral_reference import mistral_common, write_hf_tokenizer
from tests.polar.harness.test_harness_matrix import agent_calls, assert_replayed, replay
from tests.polar.run.test_cli import polar_run
from tests.polar_mitm.tokens.test_reply_families import TOKENIZERS
from tests.prompt_oracle import assert_prompt_faithful

pytestmark = pytest.mark.slow

# family -> (the reply format its models write, the template the proxy renders with when not the model's own,
# the markup that opens a call in what the model samples)
FAMILIES = {"qwen3": ("hermes", None, "<tool_call>"),
            "gemma3": ("tool_code", OWN_TEMPLATES["Gemma 3"], "```tool_code\n"),
            "mistral": ("mistral_v3", None, "[TOOL_CALLS]"),
            "gptoss": ("harmony", TEMPLATES / "harmony.jinja", "<|constrain|>json<|message|>{"),
            "llama3_1": ("llama_models", TEMPLATES / "llama3_tools.jinja", '{"type": "function", "name": '),
            "deepseek_v3": ("deepseek_v3_plain", OWN_TEMPLATES["DeepSeek V3/R1"], "<｜tool▁calls▁begin｜>")}
# gpt-oss stops at a call's <|call|>: one call a reply, so its session writes the file, then appends the line
ONE_CALL_A_REPLY = {"gptoss"}
PARSERS = {"mistral_v3": "mistral", "llama_models": "llama3_json", "deepseek_v3_plain": "deepseek_v3"}  # the proxy's parser of a reply format, where its name differs
HARNESSES = {"pi": ("base_url", "bash"), "claude-code": ("https_proxy", "Bash")}  # way in, shell tool


@pytest.fixture(scope="module")
def family_models(tmp_path_factory, make_tiny_model) -> dict[str, Path]:
    """A tiny model over each family's tokenizer, made once per module."""
    made: dict[str, Path] = {}

    def model(family: str) -> Path:
        if family not in made:
            tmp = tmp_path_factory.mktemp(family)
            converted = {"mistral": write_hf_tokenizer, "llama3_1": write_llama_tokenizer}.get(family)
            source = converted(tmp / "tokenizer") if converted else TOKENIZERS / family
            assert converted or (source / ".installed").is_file(), f"{source}: run `make setup`"
            made[family] = make_tiny_model.write_for_tokenizer(source, tmp / f"tiny-{family}")
        return made[family]
    return model


@pytest.mark.parametrize("harness", sorted(HARNESSES))
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_a_family_through_a_harness(family, harness, family_models, tmp_path, policies_dir, start_reference_server):
    model = family_models(family)
    reply_format, template, markup = FAMILIES[family]
    via, shell = HARNESSES[harness]
    one_call = family in ONE_CALL_A_REPLY
    policy = policies_dir / ("shell-twice.yaml" if one_call else "parallel-then-more.yaml")
    backend = start_reference_server(policy, model, "--reply-format", reply_format)
    out = tmp_path / "run"
    done = polar_run("--adapter", harness, "--instruction", "Write polar.txt and two.txt, then add a line.",
                     "--runtime", "bwrap", "--via", via, "--backend", backend, "--model", str(model),
                     "--out", str(out), "--confdir", str(tmp_path / "mitm"), timeout=600)
    diag = f"{family} through {harness}: {done.stdout[-2000:]}{done.stderr[-2000:]}"
    assert done.returncode == 0, diag
    assert (out / "workspace" / "polar.txt").read_text() == "polar\nagain\n", diag
    assert one_call or (out / "workspace" / "two.txt").read_text() == "two\n", diag

    tokenizer = AutoTokenizer.from_pretrained(str(model))
    if template is not None:
        tokenizer.chat_template = template.read_text()
    records = [r for f in sorted((out / "captures").glob("*/*.jsonl")) for r in read_capture_dicts(f)]
    assert f"tool calls {PARSERS.get(reply_format, reply_format)}" in (out / "logs" / "proxy.log").read_text()
    for r in records:
        assert r["error"] is None and "unparsed_tool_call" not in r["flags"], (r["error"], r["flags"])
        assert_prompt_faithful(r, tokenizer)
        assert_replayed(r, replay(backend, r))  # the ids and logprobs of a forward pass
    agent = agent_calls(records, shell)
    assert len(agent) == 3, len(records)  # two calls at once (or one), one more, "Done."
    assert [r["prefix_source"] for r in agent] == ["rendered:first_call", "substituted", "substituted"]
    assert markup in tokenizer.decode(agent[0]["output_ids"])
    first = conversation_messages(agent[0]["api"], agent[0]["request"], agent[0]["response"])["messages"][-1]
    assert [c["function"]["name"] for c in first.get("tool_calls") or []] == [shell] * (1 if one_call else 2), first
    last = conversation_messages(agent[-1]["api"], agent[-1]["request"], agent[-1]["response"])["messages"][-1]
    assert last["content"] == "Done." and not last.get("tool_calls"), last
    chats = [{"messages": r["request"]["messages"], "tools": r["request"].get("tools")} for r in agent]
    if family == "mistral" and agent[0]["api"] == "openai_chat":  # Mistral's own encoding of what pi sent
        assert mistral_common(chats)["tokens"] == [r["prompt_ids"] for r in agent]
    if family == "llama3_1" and agent[0]["api"] == "openai_chat":  # llama-models' encoding of what pi sent
        assert llama_models(chats) == [r["prompt_ids"] for r in agent]
    if family == "gptoss" and agent[0]["api"] == "openai_chat":  # openai-harmony's rendering of what pi sent
        request = agent[0]["request"]
        assert agent[0]["prompt_ids"] == harmony_ids(harmony_encoding(TOKENIZERS / "gptoss"), request["messages"],
                                                     request.get("tools"))
    table = read_trajectories(out / "trajectories.parquet").to_pylist()
    ids = [r["call_id"] for r in agent]
    (chain,) = [t for t in table if set(ids) & set(t["call_ids"])]
    assert chain["call_ids"] == ids, [t["call_ids"] for t in table]  # the agent's calls: one merged trajectory
    assert chain["prompt_ids"] + chain["response_ids"] == agent[-1]["prompt_ids"] + agent[-1]["output_ids"]

