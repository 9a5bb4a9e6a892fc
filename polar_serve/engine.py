"""The model side of the reference server: a transformers causal LM on CPU, its tokenizer, and the three forward
passes the server needs (prefill, one decode step with a KV cache, teacher-forced scoring), which start from the
prefix cache's longest match when there is one. Not thread-safe: the server calls it from one worker thread
only."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from polar_serve.prefix_cache import Flushed, PrefixCache

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # load from local directories only, never the hub


@dataclass(frozen=True)
class ModelInfo:
    model_path: str
    weight_version: str
    vocab_size: int
    eos_token_ids: tuple[int, ...]
    max_context_length: int


def _quiet_transformers() -> None:
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()


def _source(path: str) -> tuple[str, dict[str, str]]:
    """A model directory, or a .gguf file in one: the directory and the keyword that names the file."""
    p = Path(path)
    return (str(p.parent), {"gguf_file": p.name}) if p.suffix == ".gguf" else (path, {})


def _load_model(path: str, dtype: torch.dtype) -> Any:
    """A GGUF file's quantized weights are dequantized at load (to `dtype`): the server computes in float."""
    from transformers import AutoModelForCausalLM

    where, gguf = _source(path)
    return AutoModelForCausalLM.from_pretrained(where, dtype=dtype, local_files_only=True, **gguf).eval()


def _eos_ids(model: Any, tokenizer: Any) -> tuple[int, ...]:
    ids: list[int] = []
    for source in (model.generation_config.eos_token_id, model.config.eos_token_id, tokenizer.eos_token_id):
        for tid in source if isinstance(source, list) else [source]:
            if tid is not None and tid not in ids:
                ids.append(int(tid))
    if tokenizer.pad_token_id is not None and tokenizer.pad_token_id not in ids:
        ids.append(int(tokenizer.pad_token_id))  # <|endoftext|> ends a document: stop there too
    return tuple(ids)


DEFAULT_PREFIX_CACHE_MB = 512  # polar_serve.cli's default too
PREFILL_CHUNK = 256  # prompts run in chunks aligned to this many positions; the prefix cache reuses whole chunks


class Engine:
    def __init__(self, model_path: str | Path, dtype: torch.dtype = torch.float32,
                 prefix_cache_mb: float = DEFAULT_PREFIX_CACHE_MB, context_length: int = 0) -> None:
        from transformers import AutoTokenizer

        _quiet_transformers()
        self.dtype = dtype
        self.model_path = str(model_path)
        where, gguf = _source(self.model_path)
        self.tokenizer = AutoTokenizer.from_pretrained(where, local_files_only=True, **gguf)
        self.model = _load_model(self.model_path, dtype)
        self.weight_version = "0"
        self.eos_token_ids = _eos_ids(self.model, self.tokenizer)
        self.vocab_size = int(self.model.config.vocab_size)
        # `context_length` (polar serve --context-length) raises it: RoPE positions go past the trained length
        self.max_context_length = context_length or int(getattr(self.model.config, "max_position_embeddings", 4096))
        self.prefix_cache = PrefixCache(int(prefix_cache_mb * 2**20), block=PREFILL_CHUNK)

    def info(self) -> ModelInfo:
        return ModelInfo(self.model_path, self.weight_version, self.vocab_size, self.eos_token_ids,
                         self.max_context_length)

    def load_weights(self, model_path: str, weight_version: str | None = None) -> str:
        """Swap in the weights at model_path (same architecture and vocabulary); returns the new weight_version."""
        model = _load_model(model_path, self.dtype)
        if int(model.config.vocab_size) != self.vocab_size:
            raise ValueError(f"vocab_size {model.config.vocab_size} != serving model's {self.vocab_size}")
        self.model, self.model_path = model, str(model_path)
        self.prefix_cache.flush("new weights")  # KV states of the old weights must not serve the new ones
        if weight_version:
            self.weight_version = weight_version
        else:  # count up from a numeric version; after a named one, append a counter
            v = self.weight_version
            self.weight_version = str(int(v) + 1) if v.isdigit() else f"{v}+1"
        return self.weight_version

    # -- text ---------------------------------------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens,
                                     clean_up_tokenization_spaces=False)

    def token_text(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id], skip_special_tokens=False, clean_up_tokenization_spaces=False)

    # -- prefix cache -------------------------------------------------------------------------------------
    def remember(self, ids: list[int], cache: Any, prefilled: int) -> None:
        """Offer a finished sequence's KV cache over ids to the prefix cache. Only the whole chunks of the first
        `prefilled` positions (the ones _run computed; decode steps are computed differently) are kept."""
        self.prefix_cache.store(ids[: prefilled // PREFILL_CHUNK * PREFILL_CHUNK], cache, self.model.config)

    def flush_prefix_cache(self, reason: str) -> Flushed:
        return self.prefix_cache.flush(reason)

    # -- forward passes -----------------------------------------------------------------------------------
    @torch.inference_mode()
    def _run(self, ids: list[int], n_prompt: int, first_logit: int) -> tuple[torch.Tensor, Any, int]:
        """Forward ids, starting after the prefix cache's longest match (whole chunks within ids[:n_prompt - 1]);
        returns the logits at positions first_logit.., the KV cache over all of ids, and how many ids came from
        the prefix cache.

        With the prefix cache on, ids run in chunks aligned to PREFILL_CHUNK positions: every chunk is computed
        from the same inputs with the same shapes whether the chunks before it came from the cache or not, so a
        request gives bit-for-bit the numbers it would give cold (a replay equals its recording exactly). That
        costs a cold prompt some speed (measured 1.7x at 16k tokens on the tiny model); with the cache off the
        whole of ids runs in one pass."""
        cached, cache = self.prefix_cache.lookup(ids, n_prompt - 1, self.model.config)
        chunk = PREFILL_CHUNK if self.prefix_cache.enabled else len(ids)
        rows, start = [], cached
        while start < len(ids):
            end = min(len(ids), (start // chunk + 1) * chunk)
            keep = max(1, end - max(start, first_logit))  # 1: a chunk before first_logit needs no logits
            out = self.model(input_ids=torch.tensor([ids[start:end]]), cache=cache, use_cache=True,
                             logits_to_keep=keep)
            cache = out.past_key_values
            if end > first_logit:
                rows.append(out.logits[0])
            start = end
        return torch.cat(rows), cache, cached

    def prefill(self, prompt_ids: list[int]) -> tuple[torch.Tensor, Any, int]:
        """Run the prompt; returns the raw logits for the next token, the KV cache and the number of prompt
        tokens served from the prefix cache."""
        logits, cache, cached = self._run(prompt_ids, len(prompt_ids), len(prompt_ids) - 1)
        return logits[-1].float(), cache, cached

    @torch.inference_mode()
    def decode_step(self, token_id: int, cache: Any) -> tuple[torch.Tensor, Any]:
        out = self.model(input_ids=torch.tensor([[token_id]]), cache=cache, use_cache=True)
        return out.logits[0, -1].float(), out.past_key_values

    def score(self, prompt_ids: list[int], output_ids: list[int]) -> tuple[torch.Tensor, Any, int]:
        """Teacher forcing: one pass over prompt + output (after the cached prefix); row i is log_softmax of the
        logits that predict output_ids[i]. Also returns the KV cache over prompt + output and the number of
        prompt tokens served from the prefix cache."""
        if not output_ids:
            return torch.empty(0, self.vocab_size), None, 0
        logits, cache, cached = self._run(prompt_ids + output_ids, len(prompt_ids), len(prompt_ids) - 1)
        return torch.log_softmax(logits[:-1].float(), dim=-1), cache, cached
