"""A real model with trained weights through a real harness (issue 45): SmolLM2 135M Instruct, the Q4_1 GGUF file
that scripts/fetch_models.sh fetches, served by the reference server straight from the .gguf (weights dequantized
to float32) with free sampling (no scripted policy), and the proxy reading its tokenizer and chat template from the
same file. pi asks it for a haiku through the OpenAI Chat API. What is sampled is the model's own, so the checks
are against oracles apart from the server: transformers' own rendering of the request from the GGUF tokenizer, and
one forward pass of transformers over prompt + sampled ids, whose log-softmax must give every recorded logprob to
within LOGPROB_BOUND (float32: the server's chunked prefill and one-token decode steps sum in another order)."""
from __future__ import annotations

import pytest
import torch

from polar_traj import read as read_trajectories
from polar_traj.capture_reader import read_capture_dicts
from tests.conftest import ROOT
from tests.polar.run.test_cli import polar_run
from tests.prompt_oracle import assert_prompt_faithful

pytestmark = pytest.mark.slow

GGUF = ROOT / ".tools" / "models" / "smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"
LOGPROB_BOUND = 1e-4  # measured: at most 2.3e-5 over 156 sampled tokens


@pytest.fixture(scope="module")
def smollm2():
    """transformers' own reading of the GGUF file: (tokenizer, model)."""
    assert GGUF.is_file(), f"{GGUF}: run `make setup` (scripts/fetch_models.sh)"
    from transformers import AutoModelForCausalLM, AutoTokenizer

    where = {"pretrained_model_name_or_path": str(GGUF.parent), "gguf_file": GGUF.name}
    return (AutoTokenizer.from_pretrained(**where),
            AutoModelForCausalLM.from_pretrained(**where, dtype=torch.float32).eval())


def forward_logprobs(model, prompt_ids: list[int], output_ids: list[int]) -> list[float]:
    """Each sampled token's logprob from one teacher-forced forward pass over the whole sequence."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt_ids + output_ids])).logits[0]
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    return [logprobs[len(prompt_ids) - 1 + i, t].item() for i, t in enumerate(output_ids)]


def test_real_smollm2_through_pi_with_free_sampling(smollm2, tmp_path, start_reference_server):
    tokenizer, model = smollm2
    # pi asks for up to 4096 new tokens, which free sampling may spend (400 s on this CPU); a 1024-token context
    # bounds the reply to what is left after the ~660-token prompt (the proxy caps max_tokens by the context)
    backend = start_reference_server(None, GGUF, "--context-length", "1024")
    out = tmp_path / "run"
    done = polar_run("--adapter", "pi", "--instruction", "Write a haiku about the sea.", "--runtime", "bwrap",
                     "--via", "base_url", "--backend", backend, "--model", str(GGUF), "--out", str(out),
                     "--confdir", str(tmp_path / "mitm"), timeout=600)
    diag = f"{done.stdout[-2000:]}{done.stderr[-2000:]}"
    assert done.returncode == 0, diag
    assert "warning" not in done.stderr, diag  # the engine's model name is the proxy's: the same file

    records = [r for f in sorted((out / "captures").glob("*/*.jsonl")) for r in read_capture_dicts(f)]
    assert records, diag
    for r in records:
        assert r["error"] is None, r["error"]
        assert r["output_ids"] and r["finish_reason"] in ("stop", "length"), r["finish_reason"]
        assert len(r["prompt_ids"]) + len(r["output_ids"]) <= 1024
        # SmolLM2's template renders no tools: said so on the record, and the reply is the sampled text
        assert "template_dropped_tools" in r["flags"], r["flags"]
        assert_prompt_faithful(r, tokenizer)  # and the first call equals transformers' rendering of the request
        text = r["response"]["choices"][0]["message"]["content"]
        assert text == tokenizer.decode(r["output_ids"], skip_special_tokens=True), text
        got, want = r["output_logprobs"], forward_logprobs(model, r["prompt_ids"], r["output_ids"])
        worst = max(abs(a - b) for a, b in zip(got, want))
        assert worst <= LOGPROB_BOUND, (r["call_id"], worst)
    assert records[0]["prefix_source"] == "rendered:first_call"

    table = read_trajectories(out / "trajectories.parquet").to_pylist()
    first = next(t for t in table if t["call_ids"][0] == records[0]["call_id"])
    n = len(records[0]["output_ids"])
    assert first["prompt_ids"] == records[0]["prompt_ids"]
    assert first["response_ids"][:n] == records[0]["output_ids"] and first["loss_mask"][:n] == [1] * n
    assert first["logprobs"][:n] == pytest.approx(records[0]["output_logprobs"], abs=1e-6)  # float32 in Parquet
