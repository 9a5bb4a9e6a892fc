"""The inference engine's token APIs (docs/design.md §5): request bodies and their answers, streamed or not."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Sequence

from polar_mitm.conversation import Sampling

ENGINES = ("sglang", "vllm")


@dataclass
class EngineOutput:
    """Sampled tokens as they accumulate; complete once `finish_reason` is set."""

    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_reason: str | None = None  # "stop" | "length"
    weight_version: int | None = None


def parse_engine(spec: str) -> str:
    if spec not in ENGINES:
        raise ValueError(f"expected one of {ENGINES}, got {spec!r}")
    return spec


def engine_request(engine: str, prompt_ids: Sequence[int], sampling: Sampling, max_new_tokens: int,
                   stream: bool, model: str | None = None) -> tuple[str, dict[str, Any]]:
    """(path, JSON body) asking the engine to continue `prompt_ids` and return ids and logprobs."""
    if engine == "sglang":
        params: dict[str, Any] = {"max_new_tokens": max_new_tokens, "skip_special_tokens": False}
        copy_sampling(sampling, params)
        if "seed" in params:
            params["sampling_seed"] = params.pop("seed")  # SGLang's name; it rejects unknown sampling keys
        return "/generate", {"input_ids": prompt_ids, "sampling_params": params,
                             "return_logprob": True, "stream": stream}
    body: dict[str, Any] = {"prompt": prompt_ids, "max_tokens": max_new_tokens, "logprobs": 1,
                            "return_token_ids": True, "skip_special_tokens": False, "stream": stream}
    if model:
        body["model"] = model
    copy_sampling(sampling, body)
    return "/v1/completions", body


def copy_sampling(s: Sampling, out: dict[str, Any]) -> None:
    for key in ("temperature", "top_p", "top_k", "seed"):
        value = getattr(s, key)
        if value is not None:
            out[key] = value
    if s.stop:
        out["stop"] = list(s.stop)


def finish_of(value: Any) -> str | None:
    if isinstance(value, dict):
        value = value.get("type")
    if value is None:
        return None
    return "length" if value == "length" else "stop"


def _version(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def apply_chunk(engine: str, data: dict[str, Any], out: EngineOutput) -> None:
    """Fold one engine answer (whole, or one streamed chunk) into `out`.

    SGLang streams cumulative `output_ids` by default and incremental ones with
    `--incremental-streaming-output`; either way only the ids past what we hold are new.
    """
    if "error" in data:
        raise EngineError(str(data["error"].get("message") if isinstance(data["error"], dict) else data["error"]))
    if engine == "sglang":
        meta = data.get("meta_info") or {}
        ids = list(data.get("output_ids") or [])
        lps = [float(t[0]) for t in meta.get("output_token_logprobs") or []]
        total = meta.get("completion_tokens")
        _extend(out, ids, lps, int(total) if total is not None else None)
        out.finish_reason = finish_of(meta.get("finish_reason")) or out.finish_reason
        out.weight_version = _version(meta.get("weight_version", out.weight_version))
        return
    for choice in data.get("choices") or []:
        ids = choice.get("token_ids")
        if ids is None:
            raise EngineError("the engine returned no token ids (vLLM >= 0.10.2 with return_token_ids is required)")
        lps = [float(x) for x in (choice.get("logprobs") or {}).get("token_logprobs") or []]
        out.output_ids.extend(ids)
        out.logprobs.extend(lps)
        out.finish_reason = finish_of(choice.get("finish_reason")) or out.finish_reason


def _extend(out: EngineOutput, ids: list[int], lps: list[float], total: int | None) -> None:
    """Append the new part of a chunk. `total` (meta_info.completion_tokens) is the cumulative count:
    when the chunk holds that many ids it is cumulative, otherwise incremental."""
    have = len(out.output_ids)
    cumulative = len(ids) == total if total is not None else (have > 0 and ids[:have] == out.output_ids)
    if cumulative:
        ids = ids[have:]
    if len(lps) > len(ids):
        lps = lps[len(lps) - len(ids):]
    out.output_ids.extend(ids)
    out.logprobs.extend(lps)


class EngineError(Exception):
    """The engine answered, but not with tokens."""


class SSEDecoder:
    """Splits an engine's `data: …` event stream into JSON objects, across arbitrary read boundaries."""

    def __init__(self) -> None:
        self._buf = b""
        self.done = False

    def feed(self, chunk: bytes) -> list[dict[str, Any]]:
        self._buf += chunk
        events = []
        while b"\n\n" in self._buf:
            raw, self._buf = self._buf.split(b"\n\n", 1)
            for line in raw.splitlines():
                if not line.startswith(b"data:"):
                    continue
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    self.done = True
                elif payload:
                    events.append(json.loads(payload))
        return events
