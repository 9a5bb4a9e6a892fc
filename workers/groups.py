"""A finished group: GRPO advantages over its usable samples (polar_traj's outcome rules), written as one
Parquet part of the batch's trajectory dataset, `<batch>/trajectories/<group_id>.parquet` (temp name, renamed).

A sample's result (SampleResult.to_dict(), as stored in `<batch>/samples/<sample_id>/result.json`) decides
its rows: `error`/`infrastructure` samples are masked (weight 0, loss_mask 0, no advantage, reason in
metadata) and left out of the group statistics; timeouts train with reward 0 (polar_traj.outcomes.resolve).
Rows whose calls span more than `max_staleness` weight versions get `metadata.stale = true`.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from polar_traj.outcomes import AdvantageConfig, group_advantages, resolve


@dataclass(frozen=True)
class GroupConfig:
    advantages: AdvantageConfig = AdvantageConfig()
    max_staleness: int | None = None  # None: never mark


def outcome_entry(result: dict[str, Any]) -> dict[str, Any]:
    """A SampleResult as a polar_traj outcome entry."""
    return {"reward": result.get("reward"), "status": result.get("status") or "error",
            "failure": result.get("failure"), "reason": result.get("reason")}


def sample_advantages(results: Iterable[dict[str, Any]], config: AdvantageConfig) -> dict[str, float | None]:
    """sample_id -> advantage (None for a masked sample or one without a reward)."""
    results = list(results)
    units = {}
    for res in results:
        r = resolve(outcome_entry(res))
        if r.trainable and r.reward is not None:
            units[res["sample_id"]] = ("group", r.reward)
    adv = group_advantages(units, config)
    return {res["sample_id"]: adv.get(res["sample_id"]) for res in results}


def group_rows(group_id: str, results: list[dict[str, Any]], config: GroupConfig) -> list[dict[str, Any]]:
    """The group's trajectory rows with rewards, advantages, weights and masks applied."""
    from polar_traj import read

    advantages = sample_advantages(results, config.advantages)
    rows: list[dict[str, Any]] = []
    for res in sorted(results, key=lambda x: x["sample_id"]):
        part = res.get("trajectories")
        if not part or not Path(part).exists():
            continue
        r = resolve(outcome_entry(res))
        for row in read(part).to_pylist():
            rows.append(_apply(row, group_id, res, r, advantages[res["sample_id"]], config))
    return rows


def _apply(row: dict[str, Any], group_id: str, res: dict[str, Any], r: Any, advantage: float | None,
           config: GroupConfig) -> dict[str, Any]:
    meta = json.loads(row.get("metadata") or "{}")
    meta["sample"] = {"sample_id": res["sample_id"], "node": res.get("node"), "status": r.status,
                      "failure": r.failure, "reason": r.reason, "masked": not r.trainable,
                      "attempts": res.get("attempts", 1), "reassigned_from": res.get("reassigned_from") or []}
    lo, hi = row.get("policy_version_min"), row.get("policy_version_max")
    if config.max_staleness is not None and lo is not None and hi is not None:
        meta["stale"] = bool(hi - lo > config.max_staleness)
    out = dict(row, group_id=group_id, status=r.status, reward=r.reward, metadata=json.dumps(meta))
    if r.trainable:
        out.update(advantage=advantage, weight=float(row["weight"]))
    else:
        out.update(advantage=None, weight=0.0, loss_mask=[0] * len(row["loss_mask"]))
    return out


def write_group(batch_dir: Path, group_id: str, results: list[dict[str, Any]], config: GroupConfig) -> Path:
    """Write (or rewrite, whole) the group's part; returns its path."""
    from polar_traj.parquet import TrajectoryWriter

    path = batch_dir / "trajectories" / f"{group_id}.parquet"
    rows = group_rows(group_id, results, config)
    with TrajectoryWriter(path) as writer:
        writer.write_all(rows)
        writer.set_metadata("polar.group", json.dumps({
            "group_id": group_id, "samples": [r["sample_id"] for r in results],
            "advantages": sample_advantages(results, config.advantages)}))
    return path
