"""Sessions through a real mitmdump on a model with a real family's tokenizer and chat template (issue 45): the
Qwen3 and Gemma 3 tokenizers and templates as published (fetched at setup), random tiny weights over their
vocabularies (scripts/make_tiny_model.py --from-tokenizer), the reference server sampling from them. Qwen3's
template renders reasoning only in the turns after the last user message; Gemma 3's renders no tools, so the proxy
renders its tool sessions with Polar's template; Mistral's Tekken (from mistral-common) is checked against
mistral-common's own encoding. Either way the proxy finds a tool turn's history as an append
(substituted), so the session merges into one chain, and every call is exact against the engine."""
from __future__ import annotations

import itertools

import httpx
import pytest
from transformers import AutoTokenizer

from polar_mitm.launch import stop
from polar_mitm.tokens.family import OWN_TEMPLATES, TEMPLATES
from polar_traj.build import BuildConfig, build_session
from polar_traj.reading import CapturedSession, SessionFile
from polar_traj.records import CallRecord
from tests.harmony_reference import encoding as harmony_encoding, harmony_ids
from tests.mistral_reference import mistral_common, write_hf_tokenizer
from tests.polar_mitm.conftest import start_proxy
from tests.polar_mitm.sdk_clients import CLIENTS, Way
from tests.polar_mitm.tokens.test_reply_families import TOKENIZERS
from tests.prompt_oracle import assert_prompt_faithful

_ids = itertools.count()
HARMONY = TEMPLATES / "harmony.jinja"


@pytest.fixture(scope="module")
def tiny_qwen3(tmp_path_factory, make_tiny_model):
    tokenizer = TOKENIZERS / "qwen3"
    assert (tokenizer / ".installed").is_file(), f"{tokenizer}: run `make setup` (scripts/fetch_tokenizers.sh)"
    return make_tiny_model.write_for_tokenizer(tokenizer, tmp_path_factory.mktemp("tiny-qwen3") / "tiny-qwen3")


@pytest.fixture(scope="module")
def qwen3_proxy(tmp_path_factory, start_reference_server, policies_dir, tiny_qwen3):
    backend = start_reference_server(policies_dir / "tool-call.yaml", tiny_qwen3)
    proc, handle = start_proxy(tmp_path_factory.mktemp("qwen3-proxy"), backend, tiny_qwen3)
    yield handle
    stop(proc)


@pytest.fixture(scope="module")
def gemma3_proxy(tmp_path_factory, start_reference_server, policies_dir, make_tiny_model):
    """The real Gemma 3 tokenizer: the proxy renders with Polar's template for its tools (auto), the reference
    server writes the policy's calls the way that template renders past calls (`--reply-format tool_code`)."""
    tokenizer = TOKENIZERS / "gemma3"
    assert (tokenizer / ".installed").is_file(), f"{tokenizer}: run `make setup` (scripts/fetch_tokenizers.sh)"
    model = make_tiny_model.write_for_tokenizer(tokenizer, tmp_path_factory.mktemp("tiny-gemma3") / "tiny-gemma3")
    backend = start_reference_server(policies_dir / "tool-call.yaml", model, "--reply-format", "tool_code")
    proc, handle = start_proxy(tmp_path_factory.mktemp("gemma3-proxy"), backend, model)
    yield handle, model
    stop(proc)


# Mistral's formats (mistral-common's names) and how the reference server writes a model of each: v3's list of
# calls with ids (NeMo), v11's [CALL_ID] (Devstral), v13's [THINK] with no ids (Magistral)
MISTRAL_VERSIONS = {"v3": (None, "mistral_v3"), "v11": ("v11", "mistral_v11"), "v13": ("v13", "mistral")}


@pytest.fixture(scope="module", params=sorted(MISTRAL_VERSIONS))
def mistral_proxy(request, tmp_path_factory, start_reference_server, policies_dir, make_tiny_model):
    """Mistral's real Tekken tokenizer with mistral-common's chat template for that format
    (tests/mistral_reference.py); the reference server writes calls as a model of that format does."""
    version, reply_format = MISTRAL_VERSIONS[request.param]
    tekken = write_hf_tokenizer(tmp_path_factory.mktemp("tekken") / "tekken", version)
    model = make_tiny_model.write_for_tokenizer(tekken, tmp_path_factory.mktemp("tiny-tekken") / "tiny-tekken")
    backend = start_reference_server(policies_dir / "tool-call.yaml", model, "--reply-format", reply_format)
    proc, handle = start_proxy(tmp_path_factory.mktemp("mistral-proxy"), backend, model)
    yield handle, model, version
    stop(proc)


@pytest.fixture(scope="module")
def tiny_gptoss(tmp_path_factory, make_tiny_model):
    """The real o200k_harmony tokenizer, published without a chat template (the proxy renders with Polar's
    harmony.jinja), under a tiny model that stops where gpt-oss does (<|return|>, <|call|>)."""
    tokenizer = TOKENIZERS / "gptoss"
    assert (tokenizer / ".installed").is_file(), f"{tokenizer}: run `make setup` (scripts/fetch_tokenizers.sh)"
    return make_tiny_model.write_for_tokenizer(tokenizer, tmp_path_factory.mktemp("tiny-gptoss") / "tiny-gptoss")


@pytest.fixture(scope="module")
def gptoss_proxy(tmp_path_factory, start_reference_server, policies_dir, tiny_gptoss):
    """The reference server writes harmony (`--reply-format harmony`): a call ended by <|call|>."""
    backend = start_reference_server(policies_dir / "tool-call.yaml", tiny_gptoss, "--reply-format", "harmony")
    proc, handle = start_proxy(tmp_path_factory.mktemp("gptoss-proxy"), backend, tiny_gptoss)
    yield handle, tiny_gptoss, harmony_encoding(TOKENIZERS / "gptoss")
    stop(proc)


@pytest.mark.parametrize("api", ["openai_chat", "anthropic"])
@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_a_qwen3_tool_session_is_exact_and_merges(qwen3_proxy, tiny_qwen3, api, stream):
    session = f"qwen3-{api}-{stream}-{next(_ids)}"
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_qwen3))
    first = tool_session(qwen3_proxy, session, api, stream, tokenizer)
    assert tokenizer.convert_tokens_to_ids("<tool_call>") in first["output_ids"]  # Qwen3's own markup token


@pytest.mark.parametrize("api", ["openai_chat", "anthropic"])
@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_a_gemma3_tool_session_is_exact_and_merges(gemma3_proxy, api, stream):
    proxy, model = gemma3_proxy
    tokenizer = AutoTokenizer.from_pretrained(str(model))
    tokenizer.chat_template = OWN_TEMPLATES["Gemma 3"].read_text()  # what the proxy renders with
    first = tool_session(proxy, f"gemma3-{api}-{stream}-{next(_ids)}", api, stream, tokenizer)
    assert "```tool_code\nshell(command=" in tokenizer.decode(first["output_ids"])


@pytest.mark.parametrize("api", ["openai_chat", "anthropic"])
@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_a_mistral_tool_session_is_mistral_commons_ids(mistral_proxy, api, stream):
    """As the Qwen3 and Gemma 3 sessions; and each Chat Completions call's prompt is the very ids mistral-common
    encodes the request as sent into (the second one substituted, so the model's sampled call with its id)."""
    proxy, model, version = mistral_proxy
    session = f"mistral-{api}-{stream}-{next(_ids)}"
    first = tool_session(proxy, session, api, stream, AutoTokenizer.from_pretrained(str(model)))
    assert AutoTokenizer.from_pretrained(str(model)).convert_tokens_to_ids("[TOOL_CALLS]") in first["output_ids"]
    if api == "openai_chat":
        records = proxy.records(session)
        chats = [{"messages": r["request"]["messages"], "tools": r["request"].get("tools")} for r in records]
        assert mistral_common(chats, version)["tokens"] == [r["prompt_ids"] for r in records]


@pytest.mark.parametrize("api", ["openai_chat", "anthropic"])
@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_a_gpt_oss_tool_session_is_openai_harmonys_ids(gptoss_proxy, api, stream):
    """As the sessions above, on harmony: the call ends at <|call|>, the tool turn's history is an append; and a
    Chat Completions session's first prompt is the very ids openai-harmony renders the request into."""
    proxy, model, encoding = gptoss_proxy
    tokenizer = AutoTokenizer.from_pretrained(str(model))
    tokenizer.chat_template = HARMONY.read_text()  # what the proxy renders with
    session = f"gptoss-{api}-{stream}-{next(_ids)}"
    first = tool_session(proxy, session, api, stream, tokenizer)
    assert first["output_ids"][-1] == tokenizer.convert_tokens_to_ids("<|call|>")
    assert "to=functions.shell<|channel|>commentary <|constrain|>json<|message|>" in tokenizer.decode(
        first["output_ids"])
    if api == "openai_chat":
        request = first["request"]
        want = harmony_ids(encoding, request["messages"], request.get("tools"))
        assert first["prompt_ids"] == want, (tokenizer.decode(first["prompt_ids"]), tokenizer.decode(want))


def test_a_gpt_oss_final_answer_is_kept_as_sampled_and_flagged(tiny_gptoss, tmp_path, policies_dir,
                                                               start_reference_server):
    """A final answer is sampled up to <|return|>, with its reasoning; harmony's history writes <|end|> and, the
    last assistant message being a final answer, drops that reasoning. The next prompt keeps what was sampled
    (substituted, one chain) and says how many tokens differ from the template's rendering."""
    backend = start_reference_server(policies_dir / "plain-answer.yaml", tiny_gptoss, "--reply-format", "harmony")
    proc, proxy = start_proxy(tmp_path / "proxy", backend, tiny_gptoss)
    try:
        first, second = two_turn_chat(proxy, "gptoss-final", max_tokens=64)
    finally:
        stop(proc)
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_gptoss))
    tokenizer.chat_template = HARMONY.read_text()
    assert first["output_ids"][-1] == tokenizer.convert_tokens_to_ids("<|return|>")
    assert tokenizer.decode(first["output_ids"]).startswith("<|channel|>analysis<|message|>No tool is needed")
    assert second["prefix_source"] == "substituted"
    assert second["prompt_ids"][: len(first["prompt_ids"]) + len(first["output_ids"])] == \
        first["prompt_ids"] + first["output_ids"]
    # the differing span runs from the dropped reasoning to the <|return|> the template writes as <|end|>
    reply = tokenizer.encode("analysis<|message|>No tool is needed for this.<|end|><|start|>assistant<|channel|>"
                             "final<|message|>Polar answers in plain text.<|return|>", add_special_tokens=False)
    assert second["flags"] == [f"history_differs_from_template:{len(reply)}"], second["flags"]
    assert_exact([first, second], tokenizer, backend, max_new_tokens=64)


def tool_session(proxy, session: str, api: str, stream: bool, tokenizer) -> dict:
    """A tool-call session through an SDK: the call reaches it, the second call is a substituted append, each
    prompt holds what was sent and its ids are the engine's; the session merges into one chain. Its first record."""
    turns = CLIENTS[api](Way(None, None, proxy.base_url, session), stream)
    assert (turns[0].tool_name, turns[0].tool_args) == ("shell", {"command": "echo polar > polar.txt"})
    assert turns[-1].text == "Done."
    records = proxy.records(session)
    first, second = records
    assert first["prefix_source"] == "rendered:first_call" and second["prefix_source"] == "substituted"
    assert [r["flags"] for r in records] == [[], []]
    assert_exact(records, tokenizer, proxy.backend, max_new_tokens=64)
    merged, _stats = build_session(CapturedSession(SessionFile("local", session, None),
                                                   [CallRecord.from_dict(r) for r in records]), BuildConfig())
    (trajectory,) = merged  # one chain: the tool turn's history was an append
    assert trajectory.prompt_ids + trajectory.response_ids == second["prompt_ids"] + second["output_ids"]
    return first


# Plain chat (no tools) on each fetched family's real template, the model sampling freely: what history
# substitution does with that template, and exactness against the engine. Gemma 3 twice: with Polar's template
# (auto; without tools it renders what Gemma's own does) and with Gemma's own (`--tool-parser none`).
PLAIN = {"qwen3": (), "deepseek_v3": (), "llama3_1": (), "gemma3": (),
         "gemma3-own": ("--set", "polar_tool_parser=none")}


@pytest.mark.parametrize("family", sorted(PLAIN))
def test_a_two_turn_chat_on_each_real_template_is_exact_and_substituted(family, tmp_path, make_tiny_model,
                                                                        start_reference_server):
    tokenizer_dir = TOKENIZERS / family.removesuffix("-own")
    assert (tokenizer_dir / ".installed").is_file(), f"{tokenizer_dir}: run `make setup`"
    model = make_tiny_model.write_for_tokenizer(tokenizer_dir, tmp_path / f"tiny-{family}")
    backend = start_reference_server(None, model)
    proc, proxy = start_proxy(tmp_path / "proxy", backend, model, *PLAIN[family])
    try:
        records = two_turn_chat(proxy, f"plain-{family}")
    finally:
        stop(proc)
    assert [r["prefix_source"] for r in records] == ["rendered:first_call", "substituted"]
    first, second = records
    assert second["prompt_ids"][: len(first["prompt_ids"]) + len(first["output_ids"])] == \
        first["prompt_ids"] + first["output_ids"]
    assert_exact(records, AutoTokenizer.from_pretrained(str(model)), backend)


def two_turn_chat(proxy, session: str, max_tokens: int = 6) -> list[dict]:
    """A plain two-turn Chat Completions session (the model samples up to `max_tokens` a turn); its records."""
    url, headers = f"{proxy.base_url}/v1/chat/completions", {"authorization": f"Bearer {session}"}
    messages = [{"role": "user", "content": "Say something."}]
    for follow_up in ("And more.", None):
        r = httpx.post(url, headers=headers, timeout=120, json={
            "model": "m", "messages": messages, "max_tokens": max_tokens, "temperature": 0})
        assert r.status_code == 200, r.text
        if follow_up:
            messages += [{"role": "assistant", "content": r.json()["choices"][0]["message"]["content"]},
                         {"role": "user", "content": follow_up}]
    return proxy.records(session)


def assert_exact(records: list[dict], tokenizer, backend: str, max_new_tokens: int = 6) -> None:
    """Each record holds what the harness sent (read with `tokenizer`, its template the proxy's), and its ids are
    what the engine samples from its prompt."""
    for r in records:
        assert r["error"] is None
        assert_prompt_faithful(r, tokenizer)
        body = {"input_ids": r["prompt_ids"], "return_logprob": True,
                "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0, "skip_special_tokens": False}}
        assert r["output_ids"] == httpx.post(backend + "/generate", json=body, timeout=60).json()["output_ids"]
