"""One request's output as it grows token by token: sampled (KV-cache decoding) or teacher-forced (a scripted
reply scored in one forward pass). Both paths share the stop rules, so a scripted reply is cut by max_new_tokens,
stop strings and stop tokens exactly like a sampled one."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from polar_serve.engine import Engine
from polar_serve.sampling import SamplingParams, choose, make_generator


@dataclass(frozen=True)
class Finish:
    reason: str  # "stop" | "length"
    matched: int | str | None = None  # the stop token id or stop string; None for length

    def sglang(self, max_new_tokens: int) -> dict[str, Any]:
        if self.reason == "length":
            return {"type": "length", "length": max_new_tokens}
        return {"type": "stop", "matched": self.matched}


@dataclass
class Output:
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top: list[list[tuple[int, float]]] = field(default_factory=list)  # per token, when top_logprobs > 0


class Sequence:
    """Call start() once, then step() until finished; all on the engine's worker thread."""

    def __init__(self, engine: Engine, prompt_ids: list[int], params: SamplingParams,
                 forced_ids: list[int] | None = None) -> None:
        self.engine = engine
        self.prompt_ids = prompt_ids
        self.params = params
        self.forced_ids = forced_ids
        self.weight_version = engine.weight_version  # set again at start(): weights may change while queued
        self.policy_rule: str | None = None  # the scripted-policy rule that produced forced_ids
        self.scripted: Any = None  # that rule's reply (polar_serve/policy.py Scripted), for the chat endpoint
        self.out = Output()
        self.cached_tokens = 0  # prompt tokens served from the prefix cache
        self.finish: Finish | None = None
        self._stop_at: int | None = None  # char index where the matched stop string starts
        self._logits: torch.Tensor | None = None
        self._cache: Any = None
        self._model: Any = None  # the model the KV cache was computed with
        self._forced_rows: torch.Tensor | None = None
        self._generator = make_generator(params.seed)

    @property
    def finished(self) -> bool:
        return self.finish is not None

    def start(self) -> None:
        self.weight_version, self._model = self.engine.weight_version, self.engine.model
        if self.params.max_new_tokens == 0:
            self.finish = Finish("length")
        elif self.forced_ids is not None:
            self._forced_rows, self._cache, self.cached_tokens = self.engine.score(self.prompt_ids, self.forced_ids)
        else:
            self._logits, self._cache, self.cached_tokens = self.engine.prefill(self.prompt_ids)

    def step(self) -> None:
        """Produce one token (and, unless that ends the sequence, run the model on it)."""
        assert not self.finished, "step() after finish"
        i = len(self.out.ids)
        if self._forced_rows is not None:
            logprobs = self._forced_rows[i]
            token = self.forced_ids[i]  # type: ignore[index]
        else:
            logprobs = torch.log_softmax(self._logits, dim=-1)  # type: ignore[arg-type]
            token = choose(self._logits, self.params, self._generator)  # type: ignore[arg-type]
        self._record(token, logprobs)
        self.finish = self._check_finish(token)
        if self.finish is None and self._forced_rows is None:
            self._logits, self._cache = self.engine.decode_step(token, self._cache)
        if self.finish is not None:
            self._release()

    def _release(self) -> None:
        """Hand the KV cache to the prefix cache (unless the weights changed since start) and drop it here."""
        if self._cache is not None and self._model is self.engine.model:
            if self.forced_ids is not None:  # scored in one pass: all of prompt + forced ids
                ids = self.prompt_ids + self.forced_ids
                self.engine.remember(ids, self._cache, len(ids))
            else:  # the output tokens went through decode steps
                self.engine.remember(self.prompt_ids + self.out.ids, self._cache, len(self.prompt_ids))
        self._logits = self._cache = self._forced_rows = None

    def _record(self, token: int, logprobs: torch.Tensor) -> None:
        self.out.ids.append(token)
        self.out.logprobs.append(float(logprobs[token]))
        k = self.params.top_logprobs
        if k > 0:
            values, ids = torch.topk(logprobs, k)
            self.out.top.append([(int(t), float(v)) for t, v in zip(ids, values)])

    def _check_finish(self, token: int) -> Finish | None:
        p = self.params
        if token in p.stop_token_ids or (not p.ignore_eos and token in self.engine.eos_token_ids):
            return Finish("stop", token)
        if p.stop:
            text = self._decoded()
            hits = [(text.find(s), s) for s in p.stop if s in text]
            if hits:
                self._stop_at, matched = min(hits)
                return Finish("stop", matched)
        if self.forced_ids is not None and len(self.out.ids) == len(self.forced_ids):
            return Finish("stop", token)  # with ignore_eos a scripted reply still ends at its final eos
        if len(self.out.ids) >= p.max_new_tokens:
            return Finish("length")
        return None

    def _decoded(self, ids: list[int] | None = None) -> str:
        return self.engine.decode(self.out.ids if ids is None else ids, self.params.skip_special_tokens)

    def text(self) -> str:
        """Text of the output so far. While running, hold back what may still change: a trailing partial
        UTF-8 character and a tail that could be the start of a stop string. Later values extend earlier ones."""
        f, p = self.finish, self.params
        if f is not None and f.reason == "stop" and isinstance(f.matched, int) and not p.keep_stop:
            return self._decoded(self.out.ids[:-1])
        text = self._decoded()
        if f is not None:
            if self._stop_at is not None:
                return text[: self._stop_at + (len(f.matched) if p.keep_stop else 0)]  # type: ignore[arg-type]
            return text
        text = text.rstrip("\ufffd")
        for n in range(min(len(text), max((len(s) for s in p.stop), default=1) - 1), 0, -1):
            if any(s.startswith(text[-n:]) for s in p.stop):
                return text[:-n]
        return text
