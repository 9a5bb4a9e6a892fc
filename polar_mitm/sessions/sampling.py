"""Sampling fixed by the trainer (a batch, `polar run --task`), never by the agent (docs/design.md §10).

A session may carry fixed values for `temperature`, `top_p`, `top_k`, `max_tokens` and `seed`; the proxy then
samples every call of the session with them, whatever the request asks for, and flags each value it overrode
(`sampling_override:<name>`) in the call's record. Values a session leaves unset are the request's own.

A fixed seed is a base: each session is sampled with `seed + a hash of its session id`, so the samples of one
group (same prompt, same base seed) still differ, and a sample that is run again gets its seed again."""
from __future__ import annotations

import argparse
import math
import zlib
from dataclasses import replace
from typing import Any

from polar_mitm.conversation import Sampling

FIXABLE = ("temperature", "top_p", "top_k", "max_tokens", "seed")
OVERRIDE_FLAG = "sampling_override:"  # + the parameter's name
SEED_RANGE = 2 ** 31  # seeds stay within a signed 32-bit integer, which every engine takes


def _number(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"sampling {name}: expected a finite number, got {value!r}")
    return float(value)


def _integer(name: str, value: Any, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"sampling {name}: expected a whole number >= {low}, got {value!r}")
    return value


def parse_sampling(data: dict[str, Any] | None) -> Sampling | None:
    """Fixed sampling from its JSON form (None or {} = nothing fixed); raises ValueError naming the bad key."""
    if not data:
        return None
    if not isinstance(data, dict):
        raise ValueError(f"sampling: expected an object, got {data!r}")
    unknown = sorted(set(data) - set(FIXABLE))
    if unknown:
        raise ValueError(f"sampling: unknown {', '.join(map(repr, unknown))} (expected some of {', '.join(FIXABLE)})")
    values: dict[str, Any] = {}
    for name, value in data.items():
        if value is None:
            continue
        if name == "temperature":
            values[name] = _number(name, value)
            if values[name] < 0:
                raise ValueError(f"sampling temperature: expected 0 or more, got {value!r}")
        elif name == "top_p":
            values[name] = _number(name, value)
            if not 0 < values[name] <= 1:
                raise ValueError(f"sampling top_p: expected a number in (0, 1], got {value!r}")
        else:
            values[name] = _integer(name, value, 0 if name == "seed" else 1)
    return Sampling(**values) if values else None


def sampling_dict(sampling: Sampling | None) -> dict[str, Any] | None:
    """The JSON form of fixed sampling (only the values set); None when nothing is fixed."""
    if sampling is None:
        return None
    data = {name: getattr(sampling, name) for name in FIXABLE if getattr(sampling, name) is not None}
    return data or None


def session_sampling(fixed: Sampling | None, session_id: str) -> Sampling | None:
    """What one session is sampled with: `fixed`, its seed (when set) made the session's own."""
    if fixed is None or fixed.seed is None:
        return fixed
    return replace(fixed, seed=(fixed.seed + zlib.crc32(session_id.encode())) % SEED_RANGE)


def apply_fixed(requested: Sampling, fixed: Sampling | None) -> tuple[Sampling, list[str]]:
    """The sampling a call is sent with, and a flag for each value the request asked for and did not get."""
    if fixed is None:
        return requested, []
    changes, flags = {}, []
    for name in FIXABLE:
        value = getattr(fixed, name)
        if value is None:
            continue
        asked = getattr(requested, name)
        if asked is not None and asked != value:
            flags.append(OVERRIDE_FLAG + name)
        changes[name] = value
    return replace(requested, **changes), flags


# -- the same five flags on `polar run` and `polar submit` -------------------------------------------------------------
def add_sampling_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("sampling fixed for every LLM call (the agent's requests cannot change it)")
    group.add_argument("--temperature", type=float, help="sampling temperature (0 or more)")
    group.add_argument("--top-p", type=float, help="nucleus sampling mass, in (0, 1]")
    group.add_argument("--top-k", type=int, help="sample among the k most likely tokens (1 or more)")
    group.add_argument("--max-tokens", type=int, help="most new tokens per call (1 or more)")
    group.add_argument("--seed", type=int, help="base seed (0 or more); each session gets its own from it")


def sampling_from_args(args: argparse.Namespace) -> dict[str, Any] | None:
    """The flags given, validated; raises ValueError naming the bad one."""
    return sampling_dict(parse_sampling({name: getattr(args, name) for name in FIXABLE}))
