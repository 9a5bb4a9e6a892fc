"""vLLM's `POST /v1/completions` with token ids (`return_token_ids`, vLLM >= 0.10.2), one prompt, n = 1.

As in vLLM, `prompt_token_ids` and `token_ids` sit inside the choice; when streaming, the first chunk carries
`prompt_token_ids` and every chunk the delta `text`, `token_ids` and `logprobs`; with
`stream_options.include_usage` a last chunk with empty `choices` carries `usage`; then `data: [DONE]`."""
from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any

from polar_serve.params import (BadRequest, as_object, get_bool, get_float, get_ids, get_int, get_strings,
                                is_id_list, require_neutral)
from polar_serve.sampling import SamplingParams
from polar_serve.sequence import Sequence

NEUTRAL = {"n": 1, "echo": False, "best_of": 1, "use_beam_search": False, "min_p": 0.0, "frequency_penalty": 0.0,
           "presence_penalty": 0.0, "repetition_penalty": 1.0, "min_tokens": 0, "suffix": None}


@dataclass(frozen=True)
class CompletionRequest:
    prompt_ids: list[int] | None
    prompt_text: str | None
    params: SamplingParams
    stream: bool
    logprobs: bool
    return_token_ids: bool
    include_usage: bool
    tokens_as_ids: bool


def _prompt(value: Any) -> tuple[list[int] | None, str | None]:
    if isinstance(value, list) and len(value) == 1 and (isinstance(value[0], str) or is_id_list(value[0])):
        value = value[0]  # a batch of one
    if isinstance(value, str):
        return None, value
    if is_id_list(value):
        return value, None
    raise BadRequest("`prompt` must be a list of token ids or a string (one prompt; batches are not supported)")


def parse_request(raw: Any) -> CompletionRequest:
    body = as_object(raw)
    require_neutral(body, NEUTRAL)
    if "prompt" not in body:
        raise BadRequest("`prompt` is required")
    prompt_ids, prompt_text = _prompt(body["prompt"])
    logprobs = get_int(body, "logprobs", None)
    top_k = get_int(body, "top_k", -1)
    options = as_object(body.get("stream_options") or {}, "`stream_options`")
    params = SamplingParams(
        max_new_tokens=get_int(body, "max_tokens", 16),  # type: ignore[arg-type]
        temperature=get_float(body, "temperature", 1.0),
        top_p=get_float(body, "top_p", 1.0),
        top_k=-1 if top_k == 0 else top_k,  # type: ignore[arg-type]  # vLLM: 0 and -1 both mean off
        seed=get_int(body, "seed", None),
        stop=get_strings(body, "stop"),
        stop_token_ids=get_ids(body, "stop_token_ids"),
        ignore_eos=get_bool(body, "ignore_eos", False),
        skip_special_tokens=get_bool(body, "skip_special_tokens", True),
        keep_stop=get_bool(body, "include_stop_str_in_output", False),
        top_logprobs=logprobs or 0,
    )
    if params.max_new_tokens < 1:
        raise BadRequest(f"`max_tokens` must be at least 1, got {params.max_new_tokens}")
    return CompletionRequest(prompt_ids, prompt_text, params, get_bool(body, "stream", False), logprobs is not None,
                             get_bool(body, "return_token_ids", False), get_bool(options, "include_usage", False),
                             get_bool(body, "return_tokens_as_token_ids", False))


@dataclass
class Cursor:
    """What earlier chunks already sent."""
    tokens: int = 0
    chars: int = 0
    first: bool = True


class Renderer:
    def __init__(self, req: CompletionRequest, model_name: str) -> None:
        self.req = req
        self.model_name = model_name
        self.id = f"cmpl-{uuid.uuid4().hex}"
        self.created = int(time.time())

    def _token(self, seq: Sequence, tid: int) -> str:
        return f"token_id:{tid}" if self.req.tokens_as_ids else seq.engine.token_text(tid)

    def _logprobs(self, seq: Sequence, start: int, char0: int) -> dict[str, Any] | None:
        if not self.req.logprobs:
            return None
        out = seq.out
        tokens = [self._token(seq, t) for t in out.ids[start:]]
        offsets, pos = [], char0
        for tok in tokens:
            offsets.append(pos)
            pos += len(tok)
        alternatives = out.top[start:] if out.top else [[] for _ in tokens]
        top = [{self._token(seq, t): lp for t, lp in [*alts, (tid, chosen)]}  # vLLM lists the sampled one too
               for alts, tid, chosen in zip(alternatives, out.ids[start:], out.logprobs[start:])]
        return {"text_offset": offsets, "token_logprobs": out.logprobs[start:], "tokens": tokens, "top_logprobs": top}

    def _choice(self, seq: Sequence, start: int, char0: int, text: str, first: bool) -> dict[str, Any]:
        f = seq.finish
        stop_reason = None
        if f is not None and f.reason == "stop" and (isinstance(f.matched, str) or
                                                     f.matched in seq.params.stop_token_ids):
            stop_reason = f.matched  # vLLM: None when the model's own eos ended it
        choice: dict[str, Any] = {
            "index": 0, "text": text, "logprobs": self._logprobs(seq, start, char0),
            "finish_reason": f.reason if f else None, "stop_reason": stop_reason,
        }
        if self.req.return_token_ids:
            choice["token_ids"] = seq.out.ids[start:]
            if first:
                choice["prompt_token_ids"] = seq.prompt_ids
        return choice

    def usage(self, seq: Sequence) -> dict[str, Any]:
        n_prompt, n_out = len(seq.prompt_ids), len(seq.out.ids)
        return {"prompt_tokens": n_prompt, "total_tokens": n_prompt + n_out, "completion_tokens": n_out,
                "prompt_tokens_details": {"cached_tokens": seq.cached_tokens}}  # as vLLM with prefix caching

    def response(self, seq: Sequence) -> dict[str, Any]:
        choice = self._choice(seq, 0, 0, seq.text(), True)
        choice["prompt_logprobs"] = None
        return {"id": self.id, "object": "text_completion", "created": self.created, "model": self.model_name,
                "choices": [choice], "usage": self.usage(seq)}

    def chunk(self, seq: Sequence, cursor: Cursor) -> dict[str, Any]:
        text = seq.text()
        choice = self._choice(seq, cursor.tokens, cursor.chars, text[cursor.chars:], cursor.first)
        cursor.tokens, cursor.chars, cursor.first = len(seq.out.ids), len(text), False
        return {"id": self.id, "object": "text_completion", "created": self.created, "model": self.model_name,
                "choices": [choice], "usage": None}

    def usage_chunk(self, seq: Sequence) -> dict[str, Any]:
        return {"id": self.id, "object": "text_completion", "created": self.created, "model": self.model_name,
                "choices": [], "usage": self.usage(seq)}
