"""Rewards, statuses, failure masking, GRPO group advantages and weights.

An outcomes file (JSON, JSONL or YAML) holds entries, each for a session (`session_id`) or for one
trajectory (`trajectory_id`, as built: "<session_id>/<strategy>/<first_call_id>"):
    {session_id, reward, status, failure, reason, group_id, harness, metadata, task_id}
Accepted shapes: a list of entries (JSON/YAML, or one per line in JSONL); {"sessions": …, "trajectories":
…} where each is a list of entries or a mapping id -> entry; or a plain mapping session_id -> entry. An
entry may be just a number (the reward).

Masking rules:
- status `timeout` (or failure `agent_timeout`): the agent ran out of budget; trainable, reward 0.0.
- failure `malformed_tool_call`: trainable, reward 0.0.
- status `error` (or failure `infrastructure`): not the policy's fault; loss_mask all 0, weight 0,
  no advantage; the reason goes into metadata.
Advantages: per group (`group_id`, default the task id), over units that have a reward and are
trainable: a session (its reward broadcast to its trajectories) or a trajectory with its own reward.
A = r - mean(group), or r - mean(others) with leave_one_out; optionally divided by the group's
sample std (ddof=1) + eps. A group of one gets 0.0.
Lineage (metadata.lineage.role, lineage.py): side calls always get weight 0 and no advantage; with
lineage_reward `inherit` (default) sub-agents and compaction continuations take the session's reward and
advantage like its main chain; with `main-only` only `main` rows are trained (the others: weight 0, no
advantage). weight=session divides by the trained rows of the session only.
"""
from __future__ import annotations

import json
import math
from collections import defaultdict
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Hashable, Iterable, Mapping

import numpy as np

from .build import Trajectory, session_of
from .reading import SessionFile
from .schema import STATUSES

FAILURES = ("agent_timeout", "malformed_tool_call", "infrastructure")
ENTRY_KEYS = frozenset({"session_id", "trajectory_id", "task_id", "reward", "status", "failure", "reason",
                        "group_id", "harness", "metadata"})
WEIGHTS = ("one", "session")
LINEAGE_REWARDS = ("inherit", "main-only")


@dataclass(frozen=True)
class Outcomes:
    sessions: Mapping[str, dict[str, Any]]  # session_id -> validated entry
    trajectories: Mapping[str, dict[str, Any]]  # trajectory_id -> validated entry

    def entry(self, session_id: str, traj_id: str | None = None) -> dict[str, Any]:
        """The session's entry overlaid with the trajectory's own fields."""
        merged = dict(self.sessions.get(session_id, {}))
        if traj_id is not None:
            merged.update(self.trajectories.get(traj_id, {}))
        return merged


@dataclass(frozen=True)
class Resolved:
    status: str
    reward: float | None
    trainable: bool
    failure: str | None
    reason: str | None


@dataclass(frozen=True)
class AdvantageConfig:
    std_scale: bool = False
    leave_one_out: bool = False
    weight: str = "one"  # "one" | "session": 1 / number of trained trajectories of the session
    eps: float = 1e-6
    lineage_reward: str = "inherit"  # "inherit" | "main-only": which lineage roles are trained

    def __post_init__(self) -> None:
        if self.weight not in WEIGHTS:
            raise ValueError(f"weight {self.weight!r}: expected one of {WEIGHTS}")
        if self.lineage_reward not in LINEAGE_REWARDS:
            raise ValueError(f"lineage_reward {self.lineage_reward!r}: expected one of {LINEAGE_REWARDS}")

    def trains(self, role: str) -> bool:
        """Whether a trajectory of this lineage role gets a weight and an advantage."""
        return role != "side_call" and (self.lineage_reward == "inherit" or role == "main")


def load_outcomes(path: str | Path) -> Outcomes:
    path = Path(path)
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".jsonl":
        data: Any = [json.loads(line) for line in text.splitlines() if line.strip()]
    elif path.suffix in (".yaml", ".yml"):
        import yaml

        data = yaml.safe_load(text)
    else:
        data = json.loads(text)
    try:
        return parse_outcomes(data)
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from e


def parse_outcomes(data: Any) -> Outcomes:
    sessions: dict[str, dict[str, Any]] = {}
    trajectories: dict[str, dict[str, Any]] = {}
    if isinstance(data, dict) and data and set(data) <= {"sessions", "trajectories"}:
        _collect(data.get("sessions") or {}, "session_id", sessions, trajectories)
        _collect(data.get("trajectories") or {}, "trajectory_id", sessions, trajectories)
    elif isinstance(data, (dict, list)) or data is None:
        _collect(data or {}, "session_id", sessions, trajectories)
    else:
        raise ValueError(f"outcomes must be a list or a mapping, not {type(data).__name__}")
    return Outcomes(sessions, trajectories)


def _collect(part: Any, id_key: str, sessions: dict, trajectories: dict) -> None:
    items: Iterable[tuple[Any, Any]]
    if isinstance(part, dict):
        items = part.items()
    elif isinstance(part, list):
        items = ((None, raw) for raw in part)
    else:
        raise ValueError(f"expected a list or a mapping of entries, not {type(part).__name__}")
    for key, raw in items:
        entry = parse_entry(raw)
        if key is not None:
            entry.setdefault(id_key, str(key))
        if "trajectory_id" in entry:
            trajectories[entry["trajectory_id"]] = entry
        elif "session_id" in entry:
            sessions[entry["session_id"]] = entry
        else:
            raise ValueError(f"entry {raw!r} names neither session_id nor trajectory_id")


def parse_entry(raw: Any) -> dict[str, Any]:
    """One validated entry; raises ValueError naming the bad field."""
    if raw is None or (isinstance(raw, (int, float)) and not isinstance(raw, bool)):
        raw = {"reward": raw}
    if not isinstance(raw, dict):
        raise ValueError(f"an outcome entry must be a mapping or a number, not {raw!r}")
    unknown = set(raw) - ENTRY_KEYS
    if unknown:
        raise ValueError(f"unknown outcome fields {sorted(unknown)} (known: {sorted(ENTRY_KEYS)})")
    entry = dict(raw)
    reward = entry.get("reward")
    if reward is not None:
        if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(reward):
            raise ValueError(f"reward {reward!r}: expected a finite number or null")
        entry["reward"] = float(reward)
    if entry.get("status", "completed") not in STATUSES:
        raise ValueError(f"status {entry['status']!r}: expected one of {STATUSES}")
    if entry.get("failure") is not None and entry["failure"] not in FAILURES:
        raise ValueError(f"failure {entry['failure']!r}: expected one of {FAILURES}")
    if not isinstance(entry.get("metadata", {}), dict):
        raise ValueError("metadata must be a mapping")
    for key in ("session_id", "trajectory_id", "task_id", "group_id", "harness", "reason"):
        if entry.get(key) is not None:
            entry[key] = str(entry[key])
    return entry


def is_masked(status: Any, failure: Any) -> bool:
    """Not the policy's fault (an error, an infrastructure failure): trained on with weight 0. The one rule
    the workers' stage, the report's counts and `resolve` share."""
    return failure == "infrastructure" or status == "error"


def resolve(entry: Mapping[str, Any]) -> Resolved:
    """Apply the masking rules to one (merged) entry."""
    status, failure, reason = entry.get("status", "completed"), entry.get("failure"), entry.get("reason")
    reward = entry.get("reward")
    if is_masked(status, failure):
        return Resolved("error", reward, False, failure or "infrastructure", reason)
    if failure == "agent_timeout" or status == "timeout":
        return Resolved("timeout", 0.0, True, failure or "agent_timeout", reason)
    if failure == "malformed_tool_call":
        return Resolved(status, 0.0, True, failure, reason)
    return Resolved(status, reward, True, failure, reason)


def group_advantages(units: Mapping[Hashable, tuple[str, float]], config: AdvantageConfig) -> dict[Hashable, float]:
    """units: key -> (group_id, reward). GRPO-style advantages, per group."""
    groups: dict[str, list[Hashable]] = defaultdict(list)
    for key, (group, _) in units.items():
        groups[group].append(key)
    out: dict[Hashable, float] = {}
    for keys in groups.values():
        r = np.array([units[k][1] for k in keys], dtype=np.float64)
        if len(r) < 2:
            out[keys[0]] = 0.0
            continue
        baseline = (r.sum() - r) / (len(r) - 1) if config.leave_one_out else r.mean()
        adv = r - baseline
        if config.std_scale:
            adv = adv / (r.std(ddof=1) + config.eps)
        out.update(zip(keys, adv.tolist()))
    return out


class OutcomePlan:
    """Outcomes resolved against the sessions of one build, with advantages computed up front (they need
    only rewards and groups), so sessions can then be built and written one at a time."""

    def __init__(self, outcomes: Outcomes, files: Iterable[SessionFile], config: AdvantageConfig) -> None:
        self.outcomes, self.config = outcomes, config
        self.group_of = {sf.session_id: outcomes.sessions.get(sf.session_id, {}).get("group_id") or sf.task_id
                         for sf in files}
        units: dict[Hashable, tuple[str, float]] = {}
        for sid in self.group_of:
            r = resolve(outcomes.entry(sid))
            if r.trainable and r.reward is not None:
                units[("session", sid)] = (self.group_of[sid], r.reward)
        for tid, own in outcomes.trajectories.items():
            sid = own.get("session_id") or session_of(tid)
            r = resolve(outcomes.entry(sid, tid))
            if sid in self.group_of and "reward" in own and r.trainable and r.reward is not None:
                units[("trajectory", tid)] = (own.get("group_id") or self.group_of[sid], r.reward)
        self.advantages = group_advantages(units, config)

    def apply(self, trajectories: list[Trajectory]) -> list[Trajectory]:
        trained = sum(self.config.trains(role_of(t)) for t in trajectories)
        return [self._apply_one(t, max(trained, 1)) for t in trajectories]

    def _apply_one(self, t: Trajectory, session_size: int) -> Trajectory:
        entry = self.outcomes.entry(t.session_id, t.trajectory_id)
        r = resolve(entry)
        by_lineage = self.config.trains(role_of(t))
        own = self.outcomes.trajectories.get(t.trajectory_id, {})
        unit = ("trajectory", t.trajectory_id) if ("trajectory", t.trajectory_id) in self.advantages \
            else ("session", t.session_id)
        source = "trajectory" if "reward" in own else "session" if "reward" in entry or r.reward is not None else None
        weight = (1.0 if self.config.weight == "one" else 1.0 / session_size) if r.trainable and by_lineage else 0.0
        extra: dict[str, Any] = {"outcome": {"status": r.status, "failure": r.failure, "reason": r.reason,
                                             "reward_source": source, "masked": not r.trainable}}
        if not by_lineage:  # weight 0 for its lineage role: say which rule did it
            extra["outcome"]["untrained_by_lineage"] = self.config.lineage_reward
        harness = entry.get("harness") or (entry.get("metadata") or {}).get("harness")
        if harness:
            extra["harness"] = harness
        if entry.get("metadata"):
            extra["task"] = entry["metadata"]
        return replace(
            t.with_metadata(**extra),
            group_id=own.get("group_id") or self.group_of.get(t.session_id) or t.task_id,
            status=r.status, reward=r.reward,
            advantage=self.advantages.get(unit) if r.trainable and by_lineage else None,
            weight=weight,
            loss_mask=t.loss_mask if r.trainable else [0] * len(t.loss_mask),
        )


def role_of(t: Trajectory) -> str:
    return (t.metadata.get("lineage") or {}).get("role", "main")


def no_outcomes() -> Outcomes:
    return Outcomes({}, {})
