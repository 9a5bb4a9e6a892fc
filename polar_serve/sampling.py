"""Sampling parameters and the choice of the next token. Logprobs are never taken from here: the sequence records
log_softmax of the raw logits, whatever temperature/top-p/top-k did to the sampling distribution."""
from __future__ import annotations

import secrets
from dataclasses import dataclass

import torch

GREEDY_BELOW = 1e-5  # temperatures under this are treated as 0 (greedy), as SGLang does


@dataclass(frozen=True)
class SamplingParams:
    max_new_tokens: int = 128
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # <= 0: off
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    keep_stop: bool = False  # SGLang no_stop_trim / vLLM include_stop_str_in_output
    top_logprobs: int = 0  # alternatives to record per token (vLLM `logprobs=k`)

    def validate(self, vocab_size: int) -> None:
        """Raise ValueError naming the bad field."""
        if self.max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be >= 0, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if not 0 <= self.top_logprobs <= 20:
            raise ValueError(f"logprobs must be in [0, 20], got {self.top_logprobs}")
        if any(not s for s in self.stop):
            raise ValueError("stop strings must be non-empty")
        bad = [t for t in self.stop_token_ids if not 0 <= t < vocab_size]
        if bad:
            raise ValueError(f"stop_token_ids out of vocabulary range [0, {vocab_size}): {bad}")

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_BELOW


def make_generator(seed: int | None) -> torch.Generator:
    """Per-request generator: a given seed replays the same samples whatever else the server is doing."""
    return torch.Generator().manual_seed(seed if seed is not None else secrets.randbits(63))


def choose(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator) -> int:
    """Pick the next token id from 1-D raw logits."""
    if params.greedy:
        return int(torch.argmax(logits))
    scores = logits.float() / params.temperature
    if 0 < params.top_k < scores.numel():
        kth = torch.topk(scores, params.top_k).values[-1]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    if params.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        # keep the smallest prefix whose mass reaches top_p (the first token always survives)
        drop = torch.cumsum(sorted_probs, dim=-1) - sorted_probs >= params.top_p
        sorted_probs = sorted_probs.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter(0, order, sorted_probs)
    return int(torch.multinomial(probs, 1, generator=generator))
