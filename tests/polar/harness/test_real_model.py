"""Real models with trained weights through a real harness (issue 45), as the GGUF files scripts/fetch_models.sh
fetches, served by the reference server straight from the .gguf (weights dequantized to float32) with free
sampling (no scripted policy). pi asks each for a haiku through the OpenAI Chat API:
- SmolLM2 135M Instruct (Q4_1): the proxy reads its tokenizer and chat template from the same file;
- Gemma 3 270M (Q4_K_M, the base model): its file holds no chat template, so the proxy reads the published Gemma 3
  tokenizer (.tools/tokenizers/gemma3, the same vocabulary) and renders pi's tools into the prompt as Gemma's
  prompt-based calling does (Polar's gemma3_tools.jinja); a ```tool_code block it writes reaches pi as a
  tool call, or stays text flagged unparsed_tool_call (cut off, or not a call).
What is sampled is the model's own, so the checks are against oracles apart from the server: transformers' own
rendering of the request, and one forward pass of transformers over prompt + sampled ids, whose log-softmax must
give every recorded logprob to within LOGPROB_BOUND (float32: the server's chunked prefill and one-token decode
steps sum in another order)."""
from __future__ import annotations

import json

import pytest
import torch

from polar_mitm.tokens.family import OWN_TEMPLATES
from polar_traj import read as read_trajectories
from polar_traj.capture_reader import read_capture_dicts
from tests.conftest import ROOT
from tests.polar.run.test_cli import polar_run
from tests.prompt_oracle import assert_prompt_faithful

pytestmark = pytest.mark.slow

MODELS = ROOT / ".tools" / "models"
SMOLLM2 = MODELS / "smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"
GEMMA3 = MODELS / "gemma3" / "gemma-3-270m-q4_k_m.gguf"
GEMMA3_TOKENIZER = ROOT / ".tools" / "tokenizers" / "gemma3"
# The server de-quantizes a GGUF file's weights at every start: 43 s for Gemma alone here, past 120 s under the
# suite's load (a run's start failed so)
GGUF_START_S = 600.0
LOGPROB_BOUND = 1e-4  # measured: at most 2.3e-5 over 156 SmolLM2 tokens, 1.3e-5 over 96 Gemma 3 tokens


def gguf_model(path):
    """transformers' own reading of a GGUF file's weights (dequantized to float32)."""
    assert path.is_file(), f"{path}: run `make setup` (scripts/fetch_models.sh)"
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    return AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32).eval()


def forward_logprobs(model, prompt_ids: list[int], output_ids: list[int]) -> list[float]:
    """Each sampled token's logprob from one teacher-forced forward pass over the whole sequence."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt_ids + output_ids])).logits[0]
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    return [logprobs[len(prompt_ids) - 1 + i, t].item() for i, t in enumerate(output_ids)]


def pi_writes_a_haiku(tmp_path, backend: str, tokenizer_path, *extra: str) -> tuple[list[dict], object, str]:
    """polar run: pi through the proxy (base URL) on `backend`, the proxy reading `tokenizer_path`, `extra` flags
    added; the run's capture records, its folder and what it printed."""
    out = tmp_path / "run"
    done = polar_run("--adapter", "pi", "--instruction", "Write a haiku about the sea.", "--runtime", "bwrap",
                     "--via", "base_url", "--backend", backend, "--model", str(tokenizer_path), "--out", str(out),
                     "--confdir", str(tmp_path / "mitm"), *extra, timeout=600)
    diag = f"{done.stdout[-2000:]}{done.stderr[-2000:]}"
    assert done.returncode == 0, diag
    assert "warning" not in done.stderr, diag  # the engine's model name is the proxy's tokenizer's
    records = [r for f in sorted((out / "captures").glob("*/*.jsonl")) for r in read_capture_dicts(f)]
    assert records, diag
    for r in records:
        assert r["error"] is None, r["error"]
        assert r["output_ids"] and r["finish_reason"] in ("stop", "length"), r["finish_reason"]
    assert records[0]["prefix_source"] == "rendered:first_call"
    return records, out, diag


def worst_logprob_error(model, records: list[dict]) -> float:
    worst = 0.0
    for r in records:
        got, want = r["output_logprobs"], forward_logprobs(model, r["prompt_ids"], r["output_ids"])
        assert len(got) == len(want) == len(r["output_ids"]), r["call_id"]
        worst = max([worst, *(abs(a - b) for a, b in zip(got, want))])
    return worst


def assert_first_row_is_the_first_call(out, first: dict) -> None:
    table = read_trajectories(out / "trajectories.parquet").to_pylist()
    row = next(t for t in table if t["call_ids"][0] == first["call_id"])
    n = len(first["output_ids"])
    assert row["prompt_ids"] == first["prompt_ids"]
    assert row["response_ids"][:n] == first["output_ids"] and row["loss_mask"][:n] == [1] * n
    assert row["logprobs"][:n] == pytest.approx(first["output_logprobs"], abs=1e-6)  # float32 in Parquet


def test_real_smollm2_through_pi_with_free_sampling(tmp_path, start_reference_server):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(SMOLLM2.parent, gguf_file=SMOLLM2.name)  # read straight from the file
    # pi asks for up to 4096 new tokens, which free sampling may spend (400 s on this CPU); a 1024-token context
    # bounds the reply to what is left after the ~660-token prompt (the proxy caps max_tokens by the context)
    backend = start_reference_server(None, SMOLLM2, "--context-length", "1024", timeout=GGUF_START_S)
    records, out, _ = pi_writes_a_haiku(tmp_path, backend, SMOLLM2)
    for r in records:
        assert len(r["prompt_ids"]) + len(r["output_ids"]) <= 1024
        # SmolLM2's template renders no tools: said so on the record, and the reply is the sampled text, trimmed at
        # either end as the proxy trims content (polar_mitm/tokens/reply_parser.py): free sampling cut at the
        # context's end may stop on a newline
        assert "template_dropped_tools" in r["flags"], r["flags"]
        assert_prompt_faithful(r, tokenizer)  # and the first call equals transformers' rendering of the request
        text = r["response"]["choices"][0]["message"]["content"]
        assert text == tokenizer.decode(r["output_ids"], skip_special_tokens=True).strip(), text
    assert worst_logprob_error(gguf_model(SMOLLM2), records) <= LOGPROB_BOUND
    assert_first_row_is_the_first_call(out, records[0])


def test_real_gemma3_270m_through_pi_with_free_sampling(tmp_path, start_reference_server):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(GEMMA3_TOKENIZER)
    tokenizer.chat_template = OWN_TEMPLATES["Gemma 3"].read_text()  # what the proxy renders pi's tools with
    backend = start_reference_server(None, GEMMA3, timeout=GGUF_START_S)
    # a base model rarely ends its turn: 48 new tokens a call (fixed sampling) bound each reply (~6 s on this CPU)
    records, out, diag = pi_writes_a_haiku(tmp_path, backend, GEMMA3_TOKENIZER, "--max-tokens", "48")
    for r in records:
        assert "template_dropped_tools" not in r["flags"], r["flags"]  # pi's tools are in the prompt
        assert "sampling_override:max_tokens" in r["flags"], r["flags"]  # pi asked for more
        assert_prompt_faithful(r, tokenizer)
        assert len(r["output_ids"]) <= 48
        message = r["response"]["choices"][0]["message"]
        wrote_call = "```tool_code" in tokenizer.decode(r["output_ids"])
        # tool_code markup it writes is a call that reached pi, or text flagged unparsed (cut off, or not a call)
        handled = bool(message.get("tool_calls")) or "unparsed_tool_call" in r["flags"]
        assert wrote_call == handled, (message, r["flags"])
        assert all(isinstance(json.loads(c["function"]["arguments"]), dict) for c in message.get("tool_calls") or ())
    worst = worst_logprob_error(gguf_model(GEMMA3), records)
    print(f"gemma3 270m: {len(records)} calls ({[r['finish_reason'] for r in records]}, "
          f"{sum(bool(r['response']['choices'][0]['message'].get('tool_calls')) for r in records)} with tool calls), "
          f"{sum(len(r['output_ids']) for r in records)} tokens, worst logprob error {worst:.2e}")
    assert worst <= LOGPROB_BOUND, diag
    assert_first_row_is_the_first_call(out, records[0])
