"""SGLang's native `POST /generate`, single request (no batches): request parsing and response shaping.

Streaming follows SGLang's default (`--incremental-streaming-output` off): every `data:` chunk carries the
*cumulative* `text`, `output_ids` and `meta_info.output_token_logprobs`, the last one with a `finish_reason`,
then `data: [DONE]`. With incremental output each chunk carries only what is new since the previous one."""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from polar_serve.params import (BadRequest, as_object, get_bool, get_float, get_ids, get_int, get_strings,
                                is_id_list, require_neutral)
from polar_serve.sampling import SamplingParams
from polar_serve.sequence import Sequence

SAMPLING_KEYS = {"max_new_tokens", "temperature", "top_p", "top_k", "stop", "stop_token_ids", "seed",
                 "sampling_seed", "ignore_eos", "skip_special_tokens", "no_stop_trim", "n", "min_p",
                 "frequency_penalty", "presence_penalty", "repetition_penalty", "min_new_tokens",
                 "spaces_between_special_tokens", "json_schema", "regex", "ebnf"}
NEUTRAL = {"n": 1, "min_p": 0.0, "frequency_penalty": 0.0, "presence_penalty": 0.0, "repetition_penalty": 1.0,
           "min_new_tokens": 0}


@dataclass(frozen=True)
class GenerateRequest:
    input_ids: list[int] | None
    text: str | None
    params: SamplingParams
    stream: bool
    return_logprob: bool
    return_text_in_logprobs: bool
    top_logprobs_num: int


def parse_sampling(raw: Any) -> SamplingParams:
    sp = as_object(raw if raw is not None else {}, "`sampling_params`")
    unknown = set(sp) - SAMPLING_KEYS
    if unknown:
        raise BadRequest(f"unknown sampling_params {sorted(unknown)}")
    require_neutral(sp, NEUTRAL)
    for key in ("json_schema", "regex", "ebnf"):
        if sp.get(key) is not None:
            raise BadRequest(f"constrained decoding (`{key}`) is not supported by the reference server")
    seed = get_int(sp, "sampling_seed", None)
    return SamplingParams(
        max_new_tokens=get_int(sp, "max_new_tokens", 128),  # type: ignore[arg-type]
        temperature=get_float(sp, "temperature", 1.0),
        top_p=get_float(sp, "top_p", 1.0),
        top_k=get_int(sp, "top_k", -1),  # type: ignore[arg-type]
        seed=get_int(sp, "seed", seed),
        stop=get_strings(sp, "stop"),
        stop_token_ids=get_ids(sp, "stop_token_ids"),
        ignore_eos=get_bool(sp, "ignore_eos", False),
        skip_special_tokens=get_bool(sp, "skip_special_tokens", True),
        keep_stop=get_bool(sp, "no_stop_trim", False),
    )


def parse_request(raw: Any) -> GenerateRequest:
    body = as_object(raw)
    ids, text = body.get("input_ids"), body.get("text")
    if (ids is None) == (text is None):
        raise BadRequest("give exactly one of `input_ids` (a list of token ids) or `text`")
    if ids is not None and not is_id_list(ids):
        raise BadRequest("`input_ids` must be a flat list of token ids (batches are not supported)")
    if text is not None and not isinstance(text, str):
        raise BadRequest("`text` must be a string (batches are not supported)")
    start = get_int(body, "logprob_start_len", -1)
    if start != -1:
        raise BadRequest("only `logprob_start_len` = -1 (output tokens) is supported")
    top_n = get_int(body, "top_logprobs_num", 0) or 0
    params = parse_sampling(body.get("sampling_params"))
    if top_n:
        params = replace(params, top_logprobs=top_n)
    return GenerateRequest(ids, text, params, get_bool(body, "stream", False), get_bool(body, "return_logprob", False),
                           get_bool(body, "return_text_in_logprobs", False), top_n)


@dataclass
class Cursor:
    """How much of a sequence earlier stream chunks already carried (incremental mode)."""
    tokens: int = 0
    chars: int = 0


def render(seq: Sequence, req: GenerateRequest, rid: str, latency: float,
           cursor: Cursor | None = None) -> dict[str, Any]:
    """The response body (or one stream chunk: pass a cursor for incremental output)."""
    out, text = seq.out, seq.text()
    start, char0 = (cursor.tokens, cursor.chars) if cursor else (0, 0)
    meta: dict[str, Any] = {
        "id": rid,
        "finish_reason": seq.finish.sglang(seq.params.max_new_tokens) if seq.finish else None,
        "prompt_tokens": len(seq.prompt_ids),
        "completion_tokens": len(out.ids),
        "cached_tokens": seq.cached_tokens,
        "weight_version": seq.weight_version,
        "e2e_latency": round(latency, 6),
    }
    if seq.policy_rule is not None:
        meta["policy_rule"] = seq.policy_rule
    if req.return_logprob:
        engine = seq.engine
        meta["output_token_logprobs"] = [
            [lp, tid, engine.token_text(tid) if req.return_text_in_logprobs else None]
            for lp, tid in zip(out.logprobs[start:], out.ids[start:])]
        if req.top_logprobs_num:
            meta["output_top_logprobs"] = [
                [[lp, tid, engine.token_text(tid) if req.return_text_in_logprobs else None] for tid, lp in top]
                for top in out.top[start:]]
    if cursor:
        cursor.tokens, cursor.chars = len(out.ids), len(text)
    return {"text": text[char0:], "output_ids": out.ids[start:], "meta_info": meta}
