"""What `polar report` reads: a `polar run` folder, a batch folder, or a Parquet file / directory of parts.

run folder:   run.json, captures/<task>/<session>.jsonl, trajectories.parquet, model/<name>/ (tokenizer)
batch folder: trajectories/ (Parquet parts), sample result JSON files (polar.run.sample.SampleResult.to_dict(),
              any `*result*.json` up to three folders deep), capture folders named `captures`, an
              optional batch.json (the manifest: its samples; engine, model, policy, wall_s, …) and
              outcome.json (how a workers' batch ended: status and counts)
dataset:      a .parquet file or a directory of parts; no calls, no stage timings.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

SAMPLE_KEYS = frozenset({"sample_id", "task_id", "status", "timings"})
CALL_COLUMNS = ["call_id", "task_id", "session_id", "api", "latency_ms", "prompt_tokens", "output_tokens",
                "finish_reason", "prefix_source", "error", "started_at", "ended_at", "policy_version"]


class ReportError(ValueError):
    """The source is not something `polar report` can draw."""


@dataclass(frozen=True)
class Layout:
    kind: str  # "run" | "batch" | "dataset"
    root: Path
    parquet: Path | None
    capture_dirs: tuple[Path, ...] = ()
    result_files: tuple[Path, ...] = ()
    info: dict[str, Any] = field(default_factory=dict)  # run.json or batch.json
    tokenizer: Path | None = None


@dataclass(frozen=True)
class ReportData:
    layout: Layout
    trajectories: pd.DataFrame  # light columns + harness + meta (polar_traj.analysis.frame)
    tokens: dict[str, dict[str, Any]]  # trajectory_id -> prompt_ids, response_ids, loss_mask, logprobs
    calls: pd.DataFrame  # one row per CallRecord (empty without captures)
    samples: pd.DataFrame  # one row per sample (results, else one per session)
    merge: pd.DataFrame  # polar_traj.analysis.merge_stats, per strategy
    advantage_source: str = "stored"  # "stored" in the table, or "computed" here per group


def _tokenizer_in(folder: Path) -> Path | None:
    if not folder.is_dir():
        return None
    return next((p.parent for p in sorted(folder.rglob("tokenizer.json"))), None)


def _json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ReportError(f"{path}: not readable JSON ({e})") from e
    if not isinstance(data, dict):
        raise ReportError(f"{path}: expected a JSON object")
    return data


def _is_result(p: Path) -> bool:
    try:
        data = json.loads(p.read_text())
    except (OSError, json.JSONDecodeError):
        return False
    return isinstance(data, dict) and SAMPLE_KEYS <= data.keys()


def _results(root: Path) -> list[Path]:
    """samples/<id>/result.json (workers' layout), else any `*result*.json` up to three folders deep."""
    if (root / "samples").is_dir():
        return [p for p in sorted((root / "samples").glob("*/result.json")) if _is_result(p)]
    found = []
    for depth in ("*", "*/*", "*/*/*", "*/*/*/*"):
        found += [p for p in sorted(root.glob(f"{depth}.json"))
                  if "result" in p.name and "trajectories" not in p.parts and _is_result(p)]
    return found


def _batch_tokenizer(root: Path, info: dict[str, Any], results: tuple[Path, ...] = ()) -> Path | None:
    """batch.json's model, the model the workers recorded in a sample result, or a model folder in the batch."""
    for model in [info.get("model"), *(_json(p).get("model") for p in results[:1])]:
        if model and (Path(model) / "tokenizer.json").is_file():
            return Path(model)
    return _tokenizer_in(root / "model") or _tokenizer_in(root / "services" / "model")


def locate(source: str | os.PathLike) -> Layout:
    root = Path(source)
    if root.is_file():
        if root.suffix != ".parquet":
            raise ReportError(f"{root}: expected a run folder, a batch folder or a .parquet file")
        return Layout("dataset", root, root)
    if not root.is_dir():
        raise ReportError(f"{root}: no such file or directory")
    if (root / "run.json").is_file():
        parquet = root / "trajectories.parquet"
        return Layout("run", root, parquet if parquet.exists() else None,
                      tuple(d for d in [root / "captures"] if d.is_dir()), (), _json(root / "run.json"),
                      _tokenizer_in(root / "model"))
    if (root / "trajectories").is_dir() or (root / "batch.json").is_file():  # a cancelled batch may have no part
        info = _json(root / "batch.json") if (root / "batch.json").is_file() else {}
        if (root / "outcome.json").is_file():
            info["outcome"] = _json(root / "outcome.json")
        results = tuple(_results(root))
        # with results, their capture_files are the calls (a node's own capture folder holds the same again)
        captures = () if results else tuple(sorted(p for p in root.rglob("captures") if p.is_dir()))
        parts = root / "trajectories"
        return Layout("batch", root, parts if parts.is_dir() else None, captures, results, info,
                      _batch_tokenizer(root, info, results))
    if any(root.glob("*.parquet")):
        return Layout("dataset", root, root)
    raise ReportError(f"{root}: not a run folder (run.json), a batch folder (trajectories/) "
                      f"or a directory of Parquet parts")


def read_calls(sources: list[tuple[Path, str | None]]) -> pd.DataFrame:
    """CallRecords of capture folders (<captures>/<task>/<session>.jsonl) or single .jsonl files, each with the
    sample it belongs to when known."""
    from polar_traj.reading import iter_sessions, scan

    rows = []
    for source, sample_id in sources:
        for session in iter_sessions(scan(source), strict=False):
            for r in session.records:
                rows.append({"call_id": r.call_id, "task_id": r.task_id, "session_id": r.session_id, "api": r.api,
                             "latency_ms": r.latency_ms, "prompt_tokens": len(r.prompt_ids),
                             "output_tokens": len(r.output_ids), "finish_reason": r.finish_reason,
                             "prefix_source": r.prefix_source, "error": r.error, "started_at": r.started_at,
                             "ended_at": r.ended_at, "policy_version": r.policy_version, "sample_id": sample_id})
    return pd.DataFrame(rows, columns=CALL_COLUMNS + ["sample_id"])


def capture_sources(layout: Layout) -> list[tuple[Path, str | None]]:
    """The capture folders, and the files each sample result names (SampleResult.capture_files)."""
    found: list[tuple[Path, str | None]] = [(d, None) for d in layout.capture_dirs]
    for p in layout.result_files:
        result = _json(p)
        for f in result.get("capture_files") or []:
            path = Path(f)
            if path.is_file() and path.suffix == ".jsonl":
                found.append((path, result["sample_id"]))
    return found


def _sample_rows(layout: Layout, traj: pd.DataFrame) -> pd.DataFrame:
    """One row per sample: the result files when there are any, else one per session of the table."""
    if layout.result_files:
        rows = []
        for p in layout.result_files:
            r = _json(p)
            rows.append({"sample_id": r["sample_id"], "task_id": r["task_id"], "group_id": r.get("group_id") or "",
                         "harness": r.get("adapter") or "unknown", "status": r["status"],
                         "failure": r.get("failure"), "reason": r.get("reason"), "reward": r.get("reward"),
                         "node": r.get("node"), "timings": r.get("timings") or {},
                         "tampered": list(r.get("tampered") or []), "suspicious": list(r.get("suspicious") or []),
                         "attempts": int(r.get("attempts") or 1),
                         "reassigned_from": list(r.get("reassigned_from") or []), "engine": r.get("engine")})
        return pd.DataFrame(rows)
    timings = dict((layout.info.get("timings") or {})) if layout.kind == "run" else {}
    rows = []
    for sample_id, part in traj.groupby("sample_id", sort=True):
        first = part.iloc[0]
        outcome = first["meta"].get("outcome") or {}
        rows.append({"sample_id": sample_id, "task_id": first["task_id"], "group_id": first["group_id"],
                     "harness": first["harness"], "status": first["status"], "failure": outcome.get("failure"),
                     "reason": outcome.get("reason"), "reward": first["reward"], "node": None, "timings": timings,
                     "tampered": list((first["meta"].get("task") or {}).get("tampered") or []),
                     "suspicious": list((first["meta"].get("task") or {}).get("suspicious") or []),
                     "attempts": int((first["meta"].get("sample") or {}).get("attempts") or 1),
                     "reassigned_from": list((first["meta"].get("sample") or {}).get("reassigned_from") or [])})
    return pd.DataFrame(rows, columns=["sample_id", "task_id", "group_id", "harness", "status", "failure",
                                       "reason", "reward", "node", "timings", "tampered", "suspicious", "attempts",
                                       "reassigned_from"])


def _join_samples(samples: pd.DataFrame, traj: pd.DataFrame, calls: pd.DataFrame) -> pd.DataFrame:
    """Add each sample's trajectories, calls, tokens and first trajectory id (by traj/calls `sample_id`)."""
    if samples.empty:
        return samples.assign(trajectories=[], calls=[], trained_tokens=[], advantage=[], trajectory_id=[])
    by_sample = traj.groupby("sample_id")
    first_id = by_sample["trajectory_id"].first() if len(traj) else pd.Series(dtype=object)
    count = by_sample.size() if len(traj) else pd.Series(dtype=int)
    adv = by_sample["advantage"].first() if len(traj) else pd.Series(dtype=float)
    trained = by_sample["sampled_tokens"].sum() if len(traj) else pd.Series(dtype=int)
    ncalls = calls.groupby("sample_id").size() if len(calls) else by_sample["num_calls"].sum()
    ids = samples["sample_id"]
    return samples.assign(trajectories=ids.map(count).fillna(0).astype(int).to_numpy(),
                          calls=ids.map(ncalls).fillna(0).astype(int).to_numpy(),
                          trained_tokens=ids.map(trained).fillna(0).astype(int).to_numpy(),
                          advantage=ids.map(adv).to_numpy(), trajectory_id=ids.map(first_id).to_numpy())


def batch_advantages(traj: pd.DataFrame) -> tuple[pd.Series, str]:
    """The table's advantages, or GRPO advantages (reward - group mean) computed over the whole batch when
    the parts were scored one sample at a time (every stored advantage 0 or missing, rewards that differ
    inside a group)."""
    from polar_traj.outcomes import AdvantageConfig, group_advantages

    stored = traj["advantage"]
    scored = traj[traj["reward"].notna() & (traj["status"] != "error")].drop_duplicates("session_id")
    units = {sid: (g, float(r)) for sid, g, r in zip(scored["session_id"], scored["group_id"], scored["reward"])}
    varied = scored.groupby("group_id")["reward"].nunique().gt(1).any() if len(scored) else False
    if not varied or not stored.fillna(0.0).eq(0.0).all():
        return stored, "stored"
    computed = group_advantages(units, AdvantageConfig())
    return traj["session_id"].map(computed).astype(float), "computed"


def load(source: str | os.PathLike, tokenizer: str | os.PathLike | None = None) -> ReportData:
    from polar_traj.analysis import frame, merge_stats
    from polar_traj.parquet import read
    from polar_traj.schema import TRAJECTORY_SCHEMA

    layout = locate(source)
    if tokenizer is not None:
        layout = Layout(layout.kind, layout.root, layout.parquet, layout.capture_dirs, layout.result_files,
                        layout.info, Path(tokenizer))
    try:
        table = read(layout.parquet) if layout.parquet else TRAJECTORY_SCHEMA.empty_table()
    except (OSError, ValueError) as e:
        raise ReportError(f"{layout.parquet}: {e}") from e
    traj = frame(table)
    traj["sampled_tokens"] = [int(m.get("sampled_tokens", 0)) for m in traj["meta"]]
    # a sample's session id is its sample id unless the rows say otherwise (metadata.sample_id)
    traj["sample_id"] = [m.get("sample_id") or sid for m, sid in zip(traj["meta"], traj["session_id"])]
    if layout.kind == "run" and len(traj):
        traj["harness"] = (layout.info.get("session") or {}).get("adapter", "unknown")
    traj["advantage"], advantage_source = batch_advantages(traj) if len(traj) else (traj["advantage"], "stored")
    tokens = {tid: {"prompt_ids": p, "response_ids": r, "loss_mask": m, "logprobs": lp}
              for tid, p, r, m, lp in zip(*(table.column(c).to_pylist() for c in
                                            ("trajectory_id", "prompt_ids", "response_ids", "loss_mask", "logprobs")))}
    calls = read_calls(capture_sources(layout))
    sample_of = dict(zip(traj["session_id"], traj["sample_id"]))
    calls["sample_id"] = [known or sample_of.get(sid, sid) for known, sid in zip(calls["sample_id"], calls["session_id"])]
    samples = _join_samples(_sample_rows(layout, traj), traj, calls)
    harness = dict(zip(samples["sample_id"], samples["harness"]))
    calls["harness"] = calls["sample_id"].map(harness).astype(object).fillna("unknown") if len(calls) else []
    merge = merge_stats(table) if len(traj) else pd.DataFrame()
    return ReportData(layout, traj, tokens, calls, samples, merge, advantage_source)
