"""Trajectories of one session, token-exact, under either strategy.

per_request:  one trajectory per call: prompt = prompt_ids, response = output_ids, mask 1.
prefix_merge: one trajectory per chain (chains.py): prompt = the first call's prompt_ids; response =
              each call's output_ids (mask 1, recorded logprobs) with the engine's own prompt tokens
              between consecutive calls (mask 0, logprob 0.0). prompt + response is exactly the last
              call's prompt_ids + output_ids.
Error records (`error` set) are never trained: they are listed in metadata and counted.
Missing logprobs: `fill` (default) writes 0.0 and says so in metadata (`logprobs_complete: false`,
`logprobs_missing_call_ids`); `refuse` raises.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any, Sequence

import orjson

from .chains import ChainStart, order_calls, prefix_merge
from .lineage import session_lineage
from .reading import CapturedSession
from .records import CallRecord
from .schema import STRATEGIES
from .stats import MergeStats

MISSING_LOGPROBS = ("fill", "refuse")
UNPARSED_TOOL_CALL = "unparsed_tool_call"


@dataclass(frozen=True)
class BuildConfig:
    strategy: str = "prefix_merge"
    missing_logprobs: str = "fill"
    keep_conversation: bool = True  # store the last call's request + response (for SFT export)

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ValueError(f"strategy {self.strategy!r}: expected one of {STRATEGIES}")
        if self.missing_logprobs not in MISSING_LOGPROBS:
            raise ValueError(f"missing_logprobs {self.missing_logprobs!r}: expected one of {MISSING_LOGPROBS}")


@dataclass(frozen=True)
class Trajectory:
    """One row of the trajectory table; outcome fields are filled by outcomes.py."""

    trajectory_id: str
    task_id: str
    session_id: str
    strategy: str
    call_ids: list[str]
    prompt_ids: list[int]
    response_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]
    policy_versions: tuple[int | None, int | None]
    metadata: dict[str, Any]
    group_id: str = ""
    status: str = "completed"
    reward: float | None = None
    advantage: float | None = None
    weight: float = 1.0

    def with_metadata(self, **extra: Any) -> "Trajectory":
        return replace(self, metadata={**self.metadata, **extra})

    def row(self) -> dict[str, Any]:
        return {
            "trajectory_id": self.trajectory_id, "task_id": self.task_id, "session_id": self.session_id,
            "group_id": self.group_id or self.task_id, "strategy": self.strategy, "status": self.status,
            "prompt_ids": self.prompt_ids, "response_ids": self.response_ids, "loss_mask": self.loss_mask,
            "logprobs": self.logprobs, "call_ids": self.call_ids, "num_calls": len(self.call_ids),
            "prompt_len": len(self.prompt_ids), "response_len": len(self.response_ids),
            "policy_version_min": self.policy_versions[0], "policy_version_max": self.policy_versions[1],
            "reward": self.reward, "advantage": self.advantage, "weight": self.weight,
            "metadata": metadata_json(self.metadata),
        }


def metadata_json(metadata: dict[str, Any]) -> str:
    """json.dumps(metadata, separators=(",", ":"), ensure_ascii=False), by orjson (many times faster on long
    conversation texts) where that writes the same text. It does not for floats that need an exponent or
    are not finite (orjson spells them otherwise), nor for what orjson refuses (ints past 64 bits, keys
    that are not strings, lone surrogates): those go to json."""
    if _orjson_floats(metadata):
        try:
            return orjson.dumps(metadata).decode()
        except TypeError:  # orjson.JSONEncodeError is one
            pass
    return json.dumps(metadata, separators=(",", ":"), ensure_ascii=False)


def _orjson_floats(value: Any) -> bool:
    """Whether every float in `value` is one that orjson and repr() write alike (no exponent, finite)."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, dict):
            stack.extend(v.values())
        elif isinstance(v, (list, tuple)):
            stack.extend(v)
        elif isinstance(v, float) and not (v == 0 or 1e-4 <= abs(v) < 1e16):
            return False
    return True


def trajectory_id(session_id: str, strategy: str, first_call_id: str) -> str:
    """Stable id: a rebuild gives the same ids, so per-trajectory rewards can name them."""
    return f"{session_id}/{strategy}/{first_call_id}"


def session_of(traj_id: str) -> str:
    return traj_id.split("/", 1)[0]


def chain_tokens(calls: Sequence[CallRecord]) -> tuple[list[int], list[int], list[int], list[float]]:
    """(prompt_ids, response_ids, loss_mask, logprobs) of calls that each extend the previous one."""
    prompt = list(calls[0].prompt_ids)
    response: list[int] = []
    mask: list[int] = []
    logprobs: list[float] = []
    seen = len(prompt)  # tokens of the engine's sequence already placed
    for n, call in enumerate(calls):
        if n:
            if len(call.prompt_ids) < seen:
                raise ValueError(f"call {call.call_id} does not extend call {calls[n - 1].call_id}")
            between = call.prompt_ids[seen:]
            response.extend(between)
            mask.extend([0] * len(between))
            logprobs.extend([0.0] * len(between))
        response.extend(call.output_ids)
        mask.extend([1] * len(call.output_ids))
        logprobs.extend(call.output_logprobs or [0.0] * len(call.output_ids))
        seen = len(call.prompt_ids) + len(call.output_ids)
    return prompt, response, mask, logprobs


def call_outputs(calls: Sequence[CallRecord]) -> list[list[int | None]]:
    """[start, end, policy_version] of each call's sampled tokens in the chain's response side (as chain_tokens
    lays it out): a trainer masks or weighs each call by its own policy version."""
    base = len(calls[0].prompt_ids)
    out: list[list[int | None]] = []
    for n, call in enumerate(calls):
        start = len(call.prompt_ids) - base if n else 0
        out.append([start, start + len(call.output_ids), call.policy_version])
    return out


def build_session(session: CapturedSession, config: BuildConfig) -> tuple[list[Trajectory], MergeStats]:
    ordered = order_calls(session.records)
    usable = [r for r in ordered if r.error is None]
    errors = [{"call_id": r.call_id, "error": r.error} for r in ordered if r.error is not None]
    if config.missing_logprobs == "refuse":
        for r in usable:
            if r.output_ids and not r.output_logprobs:
                raise ValueError(f"{session.file.path}: call {r.call_id} has no logprobs (missing_logprobs=refuse)")
    chains = prefix_merge(usable)
    lineage = _lineage(session, chains, config.strategy)
    if config.strategy == "per_request":
        groups: list[tuple[tuple[CallRecord, ...], ChainStart | None]] = [((r,), None) for r in usable]
    else:
        groups = [(chain.calls, chain.start) for chain in chains]
    trajectories = [_trajectory(session, calls, start, errors, config, lineage[calls[0].call_id])
                    for calls, start in groups]
    return trajectories, _session_stats(session, usable, errors, groups, trajectories, config.strategy)


def _lineage(session: CapturedSession, chains: list, strategy: str) -> dict[str, dict[str, Any]]:
    """metadata.lineage of each trajectory, keyed by its first call (per_request: every call takes its
    chain's lineage; its parent is the parent chain's first call)."""
    if not chains:
        return {}
    def known(call_id: str) -> bool:  # else never stored: nothing to read
        return call_id in session.payloads or call_id in session.responses or call_id in session.offsets

    def payload(call_id: str) -> tuple[dict[str, Any], dict[str, Any] | None]:
        return session.payload(call_id) if known(call_id) else ({}, None)

    def reply(call_id: str) -> dict[str, Any] | None:
        return session.response(call_id) if known(call_id) else None

    found = session_lineage(chains, payload, reply)
    ids = [trajectory_id(session.session_id, strategy, c.calls[0].call_id) for c in chains]
    return {call.call_id: lin.to_dict(ids) for chain, lin in zip(chains, found)
            for call in (chain.calls if strategy == "per_request" else chain.calls[:1])}


def _trajectory(session: CapturedSession, calls: Sequence[CallRecord], start: ChainStart | None,
                errors: list[dict[str, str | None]], config: BuildConfig, lineage: dict[str, Any]) -> Trajectory:
    prompt, response, mask, logprobs = chain_tokens(calls)
    versions = [c.policy_version for c in calls if c.policy_version is not None]
    meta = _metadata(calls, start, errors, len(prompt) + len(response))
    first = calls[0].request or session.payload(calls[0].call_id)[0]
    if agent := chain_agent(first):
        meta["agent"] = agent
    if config.keep_conversation:
        last = calls[-1]
        request, reply = (last.request, last.response) if last.request else session.payload(last.call_id)
        meta["conversation"] = {"api": last.api, "call_id": last.call_id, "request": request, "response": reply}
    meta["lineage"] = lineage
    meta["call_outputs"] = call_outputs(calls)
    return Trajectory(
        trajectory_id=trajectory_id(session.session_id, config.strategy, calls[0].call_id),
        task_id=session.task_id, session_id=session.session_id, strategy=config.strategy,
        call_ids=[c.call_id for c in calls], prompt_ids=prompt, response_ids=response, loss_mask=mask,
        logprobs=logprobs, policy_versions=(min(versions, default=None), max(versions, default=None)),
        metadata=meta, group_id=session.task_id,
    )


def chain_agent(request: dict[str, Any]) -> str | None:
    """Which agent of a multi-agent run made a chain: `metadata.agent` of its first request, OpenAI's own
    request tag map (chat and Responses), which frameworks fill per agent from their model settings
    (adapters/frameworks/README.md). None when the harness names no agent."""
    tags = request.get("metadata")
    agent = tags.get("agent") if isinstance(tags, dict) else None
    return agent if isinstance(agent, str) and agent else None


def _metadata(calls: Sequence[CallRecord], start: ChainStart | None, errors: list[dict[str, str | None]],
              tokens: int) -> dict[str, Any]:
    per_request = sum(len(c.prompt_ids) + len(c.output_ids) for c in calls)
    missing = [c.call_id for c in calls if c.output_ids and not c.output_logprobs]
    return {
        "api": calls[-1].api,
        "model": calls[-1].model,
        "chain_start": start.to_dict() if start else None,
        "per_request_tokens": per_request,
        "tokens": tokens,
        "tokens_saved": per_request - tokens,
        "sampled_tokens": sum(len(c.output_ids) for c in calls),
        "finish_reason": calls[-1].finish_reason,
        "truncated_call_ids": [c.call_id for c in calls if c.finish_reason == "length"],
        "ends_truncated": calls[-1].finish_reason == "length",
        "logprobs_complete": not missing,
        "logprobs_missing_call_ids": missing,
        "unparsed_tool_call_ids": [c.call_id for c in calls if UNPARSED_TOOL_CALL in c.flags],
        "flags": {c.call_id: list(c.flags) for c in calls if c.flags},
        "rendered_calls": {c.call_id: c.prefix_source for c in calls if c.prefix_source != "substituted"},
        "engines": sorted({c.engine for c in calls if c.engine}),  # replicas that served it (CallRecord.engine)
        # calls whose proxy-side parent is not the call they follow here (a diagnostic for the proxy)
        "parent_mismatch_call_ids": [c.call_id for prev, c in zip(calls, calls[1:])
                                     if c.parent_call_id is not None and c.parent_call_id != prev.call_id],
        "session_error_calls": errors,
        "started_at": calls[0].started_at,
        "ended_at": calls[-1].ended_at,
    }


def _session_stats(session: CapturedSession, usable: list[CallRecord], errors: list[Any],
                   groups: list[tuple[tuple[CallRecord, ...], ChainStart | None]],
                   trajectories: list[Trajectory], strategy: str) -> MergeStats:
    stats = MergeStats(strategy=strategy, sessions=1, calls=len(usable), error_calls=len(errors),
                       invalid_records=len(session.problems), trajectories=len(trajectories))
    stats.calls_merged = len(usable) - len(trajectories)
    for t in trajectories:
        role = t.metadata["lineage"]["role"]
        stats.roles[role] = stats.roles.get(role, 0) + 1
    for _, start in groups:
        if start is not None:
            stats.starts[start.kind] = stats.starts.get(start.kind, 0) + 1
            if start.reason:
                stats.breaks[start.reason] = stats.breaks.get(start.reason, 0) + 1
    stats.per_request_tokens = sum(len(r.prompt_ids) + len(r.output_ids) for r in usable)
    stats.trajectory_tokens = sum(len(t.prompt_ids) + len(t.response_ids) for t in trajectories)
    stats.trained_tokens = sum(len(r.output_ids) for r in usable)
    stats.truncated_calls = sum(r.finish_reason == "length" for r in usable)
    stats.missing_logprob_calls = sum(bool(r.output_ids and not r.output_logprobs) for r in usable)
    return stats

