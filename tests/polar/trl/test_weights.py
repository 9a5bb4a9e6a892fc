"""polar.trl.weights against two real reference-server replicas: both reload the trainer's weights inside the
fence, report the same version, and then sample with exactly those weights."""
from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path

import httpx
import pytest
import torch

from polar.trl.logprobs import recompute
from polar.trl.rollouts import Row
from polar.trl.weights import FenceWeightTransfer, engine_versions
from polar_serve.launch import reference_server


class FakeFence:
    """The fence's outer edge (PolarClient.pause/resume over Redis), recording the order of events."""

    def __init__(self, engines: list[str]) -> None:
        self.engines, self.events = engines, []

    def pause(self, timeout_s: float) -> None:
        self.events.append(("pause", engine_versions(self.engines)))

    def resume(self) -> None:
        self.events.append(("resume", engine_versions(self.engines)))


def generate(url: str, prompt: list[int]) -> tuple[list[int], list[float]]:
    body = httpx.post(f"{url}/generate", timeout=60, json={
        "input_ids": prompt, "return_logprob": True,
        "sampling_params": {"max_new_tokens": 8, "temperature": 1.0, "sampling_seed": 7}}).json()
    return body["output_ids"], [t[0] for t in body["meta_info"]["output_token_logprobs"]]


def test_two_replicas_reload_inside_the_fence(tmp_path: Path, tiny_model_dir: Path):
    with ExitStack() as stack:  # two servers of this test's own: the suite's shared one keeps its weights
        engines = [stack.enter_context(reference_server(tiny_model_dir)) for _ in range(2)]
        assert engines[0] != engines[1]
        reload_both(tmp_path, tiny_model_dir, engines)


def reload_both(tmp_path: Path, tiny_model_dir: Path, engines: list[str]) -> None:
    from transformers import AutoModelForCausalLM

    fence = FakeFence(engines)
    sync = FenceWeightTransfer(fence, engines, tiny_model_dir, tmp_path / "weights",
                               version=int(engine_versions(engines)[0]))
    sync.init_weight_transfer()
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    torch.manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    start = sync.version
    assert sync.push(model) == start + 1
    assert fence.events == [("pause", [str(start)] * 2), ("resume", [str(start + 1)] * 2)]
    assert (tmp_path / "weights" / f"v{start + 1}" / "model.safetensors").is_file()
    prompt = [5, 6, 7, 8, 9]
    for url in engines:  # each replica now samples from the trainer's weights, logprobs to float precision
        ids, logprobs = generate(url, prompt)
        row = Row("t", "t", "g", prompt, ids, [1] * len(ids), logprobs, None, None, 1.0, None, None, False)
        assert (recompute(model, row) - torch.tensor(logprobs)).abs().max() <= 1e-4
    assert sync.times.total_s >= sync.times.load_s > 0


def test_failed_reload_still_lifts_the_fence(tmp_path: Path, tiny_model_dir: Path):
    from transformers import AutoModelForCausalLM

    fence = FakeFence([])
    sync = FenceWeightTransfer(fence, ["http://127.0.0.1:9"], tiny_model_dir, tmp_path / "weights")
    sync.init_weight_transfer()
    with pytest.raises(httpx.HTTPError):
        sync.push(AutoModelForCausalLM.from_pretrained(tiny_model_dir))
    assert [e for e, _ in fence.events] == ["pause", "resume"] and sync.version == 0
