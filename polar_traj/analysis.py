"""Common questions about a trajectory table, answered as pandas DataFrames.

Each helper takes a path (file or directory of parts) or a pyarrow Table. The harness of a trajectory
is `metadata.harness`, else `metadata.task.harness` (both come from the outcomes file), else "unknown".
"""
from __future__ import annotations

import json
import os
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from .chains import REASONS, START_KINDS
from .lineage import ROLES
from .parquet import read
from .schema import TOKEN_COLUMNS, TRAJECTORY_SCHEMA

Source = str | os.PathLike | pa.Table
LIGHT_COLUMNS = [c for c in TRAJECTORY_SCHEMA.names if c not in TOKEN_COLUMNS]


def _table(source: Source, columns: list[str]) -> pa.Table:
    if isinstance(source, pa.Table):
        return source.select(columns)
    return read(source, columns=columns)


def _metadata(table: pa.Table) -> list[dict[str, Any]]:
    out = []
    for raw in table.column("metadata").to_pylist():
        meta = json.loads(raw)
        meta.pop("conversation", None)
        out.append(meta)
    return out


def harness_of(meta: dict[str, Any]) -> str:
    return meta.get("harness") or (meta.get("task") or {}).get("harness") or "unknown"


def frame(source: Source, tokens: bool = False) -> pd.DataFrame:
    """The table as a DataFrame (token columns only when asked), with `harness` and parsed `meta` columns."""
    table = _table(source, list(TRAJECTORY_SCHEMA.names) if tokens else LIGHT_COLUMNS)
    df = table.to_pandas()
    meta = _metadata(table)
    df["meta"] = meta
    df["harness"] = [harness_of(m) for m in meta]
    return df


def rewards_by_harness(source: Source) -> pd.DataFrame:
    """Per harness: trajectories, sessions, how many have a reward, its mean/std/min/max, success rate
    (share of rewarded trajectories with reward > 0) and status counts."""
    df = frame(source)
    rewarded = df[df["reward"].notna()]
    out = pd.DataFrame({
        "trajectories": df.groupby("harness").size(),
        "sessions": df.groupby("harness")["session_id"].nunique(),
        "rewarded": rewarded.groupby("harness").size(),
        "reward_mean": rewarded.groupby("harness")["reward"].mean(),
        "reward_std": rewarded.groupby("harness")["reward"].std(ddof=0),
        "reward_min": rewarded.groupby("harness")["reward"].min(),
        "reward_max": rewarded.groupby("harness")["reward"].max(),
        "success_rate": rewarded.assign(ok=rewarded["reward"] > 0).groupby("harness")["ok"].mean(),
    })
    statuses = df.groupby(["harness", "status"]).size().unstack(fill_value=0)
    out["rewarded"] = out["rewarded"].fillna(0).astype("int64")
    return out.join(statuses.add_prefix("status_")).sort_index()


def turns_and_tokens(source: Source) -> pd.DataFrame:
    """One row per trajectory: turns (calls), prompt/response/total tokens, trained (mask-1) tokens."""
    table = _table(source, ["trajectory_id", "session_id", "strategy", "status", "num_calls", "prompt_len",
                            "response_len", "loss_mask", "metadata"])
    mask = table.column("loss_mask").combine_chunks()
    values = pc.list_flatten(mask).to_numpy(zero_copy_only=False)
    parents = pc.list_parent_indices(mask).to_numpy(zero_copy_only=False)
    trained = np.bincount(parents, weights=values, minlength=table.num_rows).astype(np.int64)
    meta = _metadata(table)
    df = table.drop_columns(["loss_mask", "metadata"]).to_pandas().rename(columns={"num_calls": "turns"})
    df["harness"] = [harness_of(m) for m in meta]
    df["total_tokens"] = df["prompt_len"] + df["response_len"]
    df["trained_tokens"] = trained
    df["per_request_tokens"] = [m.get("per_request_tokens", 0) for m in meta]
    return df


def merge_stats(source: Source) -> pd.DataFrame:
    """Per strategy: sessions, calls, trajectories, calls merged, chain starts and breaks by reason,
    trainer tokens per_request vs built, tokens saved and their ratio."""
    df = frame(source)
    rows = {}
    for strategy, part in df.groupby("strategy"):
        starts = [m.get("chain_start") or {} for m in part["meta"]]
        errors = {(s, e["call_id"]) for s, m in zip(part["session_id"], part["meta"])
                  for e in m.get("session_error_calls", [])}
        per_request = int(sum(m.get("per_request_tokens", 0) for m in part["meta"]))
        tokens = int((part["prompt_len"] + part["response_len"]).sum())
        row: dict[str, Any] = {
            "sessions": part["session_id"].nunique(), "calls": int(part["num_calls"].sum()),
            "error_calls": len(errors), "trajectories": len(part),
            "calls_merged": int(part["num_calls"].sum()) - len(part),
        }
        row.update({k: sum(s.get("kind") == k for s in starts) for k in START_KINDS})
        row.update({f"break_{r}": sum(s.get("reason") == r for s in starts) for r in REASONS})
        row.update(per_request_tokens=per_request, tokens=tokens, tokens_saved=per_request - tokens,
                   token_ratio=per_request / tokens if tokens else float("nan"))
        rows[strategy] = row
    return pd.DataFrame.from_dict(rows, orient="index")


def summary(source: Source) -> dict[str, Any]:
    """Headline numbers for `polar traj stats`."""
    df = frame(source)
    rewarded = df["reward"].dropna()
    return {
        "trajectories": len(df), "tasks": int(df["task_id"].nunique()), "sessions": int(df["session_id"].nunique()),
        "groups": int(df["group_id"].nunique()), "strategies": sorted(df["strategy"].unique().tolist()),
        "statuses": {k: int(v) for k, v in df["status"].value_counts().items()},
        "rewarded": len(rewarded), "reward_mean": float(rewarded.mean()) if len(rewarded) else None,
        "prompt_tokens": int(df["prompt_len"].sum()), "response_tokens": int(df["response_len"].sum()),
        "masked": int(sum(bool((m.get("outcome") or {}).get("masked")) for m in df["meta"])),
        "logprobs_incomplete": int(sum(not m.get("logprobs_complete", True) for m in df["meta"])),
    }


def lineage_by_session(source: Source) -> pd.DataFrame:
    """Per session: trajectories by lineage role (sub-agents, compaction continuations, side calls), the
    trainer tokens of all rows (prompt + response) and of the rows that are trained (weight > 0)."""
    df = frame(source)
    if not len(df):
        return pd.DataFrame()
    df["role"] = [(m.get("lineage") or {}).get("role", "main") for m in df["meta"]]
    df["tokens"] = df["prompt_len"] + df["response_len"]
    df["trained_tokens"] = df["tokens"].where(df["weight"] > 0, 0)
    out = df.groupby(["session_id", "role"]).size().unstack(fill_value=0)
    out = out.reindex(columns=list(ROLES), fill_value=0)
    out.columns.name = None
    out.insert(0, "trajectories", out.sum(axis=1))
    out["tokens"] = df.groupby("session_id")["tokens"].sum()
    out["trained_tokens"] = df.groupby("session_id")["trained_tokens"].sum()
    return out.rename(columns={"subagent": "subagents", "compaction_continuation": "compactions",
                               "side_call": "side_calls"}).sort_index()
