"""The sections of `polar report`, each a plain function ReportData -> HTML. A section whose data is absent
stays on the page and says what is missing and where it would come from."""
from __future__ import annotations

import math
import time
from html import escape
from pathlib import Path
from typing import Any, Iterable

import pandas as pd

from polar.report.data import ReportData
from polar.report.svg import STATUS_COLORS, bars, histogram, scatter, stacked, strip
from polar_traj.outcomes import is_masked

STATUSES = ("completed", "timeout", "error")
STAGES = ("prepare_s", "run_s", "evaluate_s", "postrun_s")


def section(sid: str, title: str, body: Iterable[str]) -> str:
    return f'<section id="{sid}"><h2>{escape(title)}</h2>{"".join(body)}</section>'


def note(text: str) -> str:
    return f'<p class="note">{escape(text)}</p>'


def table(headers: list[str], rows: list[list[Any]], cls: str = "") -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{escape(_cell(v))}</td>" for v in r) + "</tr>" for r in rows)
    return f'<div class="wide"><table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'


def _cell(v: Any) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return ""
    if isinstance(v, float):
        return f"{v:,.3f}".rstrip("0").rstrip(".") if abs(v) < 1000 else f"{v:,.0f}"
    return str(v)


def short(d: ReportData, label: str) -> str:
    """A sample or group id without its batch id prefix (`<batch>.<task>.<k>` -> `<task>.<k>`)."""
    prefix = f"{d.layout.info.get('batch_id')}."
    return label[len(prefix):] if d.layout.info.get("batch_id") and label.startswith(prefix) else label


def _wall_s(d: ReportData) -> float | None:
    info = d.layout.info
    if d.layout.kind == "run":
        return (info.get("timings") or {}).get("total_s")
    if info.get("wall_s") is not None:
        return float(info["wall_s"])
    if info.get("created") and d.layout.result_files:  # submitted -> last sample result written
        return max(p.stat().st_mtime for p in d.layout.result_files) - float(info["created"])
    if len(d.calls):
        return float(d.calls["ended_at"].max() - d.calls["started_at"].min())
    return None


def _engine(d: ReportData) -> str:
    info = d.layout.info
    if info.get("engine"):
        return str(info["engine"])
    served = sorted({str(e) for e in d.samples.get("engine", pd.Series(dtype=object)).dropna()})
    if served:  # what each worker node recorded in its sample results
        return ", ".join(served)
    if d.layout.kind == "run":
        served = (d.layout.root / "logs" / "serve.log").exists()
        return "polar serve (reference server, started by polar run)" if served else "external engine"
    return "not recorded"


def header(d: ReportData) -> str:
    t, s = d.trajectories, d.samples
    versions = sorted({int(v) for c in ("policy_version_min", "policy_version_max") for v in t[c].dropna()})
    model = d.layout.tokenizer.name if d.layout.tokenizer else "not recorded"
    wall = _wall_s(d)
    rows = [["source", f"{d.layout.root} ({d.layout.kind})"],
            ["tasks", s["task_id"].nunique() if len(s) else t["task_id"].nunique()],
            ["samples", len(s)], ["trajectories", len(t)], ["calls", len(d.calls) or int(t["num_calls"].sum())],
            ["harnesses", ", ".join(sorted(set(s["harness"]) | set(t["harness"]))) or "none"],
            ["engine", _engine(d)], ["model (tokenizer)", model],
            ["policy versions", ", ".join(map(str, versions)) or "not recorded"],
            ["wall time", f"{wall:.1f} s" if wall is not None else "not recorded"]]
    for key in ("policy", "group_size", "runtime", "batch_id"):
        if d.layout.info.get(key) is not None:
            rows.append([key.replace("_", " "), d.layout.info[key]])
    return section("header", "Batch", [table(["", ""], rows, "kv")])


def status(d: ReportData) -> str:
    s = d.samples
    if s.empty:
        unfinished = _unfinished(d)
        return section("status", "Status", [note("No samples: the table is empty and there are no results."),
                                            *([_counts_line(d, unfinished)] if unfinished else []),
                                            *_run_failure(d)])
    counts = s.groupby(["harness", "status"]).size().unstack(fill_value=0)
    rows = [(h, {st: float(counts.loc[h].get(st, 0)) for st in STATUSES}) for h in counts.index]
    rows.append(("all", {st: float((s["status"] == st).sum()) for st in STATUSES}))
    failed = s[s["status"] != "completed"]
    reasons = failed.groupby([failed["status"], failed["failure"].fillna(""), failed["reason"].fillna("")]).size()
    unfinished = _unfinished(d)
    body = [_counts_line(d, unfinished), stacked("status", "Samples by status", rows, STATUSES, "samples",
                                                 STATUS_COLORS)]
    if len(reasons):
        body.append(table(["status", "failure", "reason", "samples"],
                          [[a, b, c, n] for (a, b, c), n in reasons.items()]))
    elif not unfinished:
        body.append(note("Every sample completed: no failure reasons."))
    body += _call_errors(d)
    tampered = s[s["tampered"].map(bool)] if "tampered" in s else s.iloc[:0]
    if len(tampered):
        body.append(note(f"{len(tampered)} sample(s) tampered with the verifier (changes outside the task's `submit` "
                         "allowlist, or Python start-up hooks left in HOME; dropped before scoring):"))
        body.append(table(["sample", "task", "reward", "tampered"],
                          [[r.sample_id, r.task_id, r.reward, ", ".join(r.tampered)] for r in tampered.itertuples()]))
    suspicious = s[s["suspicious"].map(bool)] if "suspicious" in s else s.iloc[:0]
    if len(suspicious):
        body.append(note(f"{len(suspicious)} sample(s) with suspicious changes (process exit, atexit, pytest "
                         "internals, import hooks, compiled files; or the observer's flags), whether or not they "
                         "paid:"))
        body.append(table(["sample", "task", "reward", "suspicious"],
                          [[r.sample_id, r.task_id, r.reward, "; ".join(r.suspicious[:5])]
                           for r in suspicious.itertuples()]))
    moved = s[s["reassigned_from"].map(bool)] if "reassigned_from" in s else s.iloc[:0]
    if len(moved):
        body.append(note(f"{len(moved)} sample(s) reassigned: their node was lost, they started again elsewhere "
                         "(the lost attempt's captures are kept as abandoned, never trained on):"))
        body.append(table(["sample", "status", "reward", "attempts", "reassigned from"],
                          [[r.sample_id, r.status, r.reward, r.attempts, ", ".join(r.reassigned_from)]
                           for r in moved.itertuples()]))
    return section("status", "Status and failure reasons", body)


def _unfinished(d: ReportData) -> list[str]:
    """Samples of the batch's manifest (batch.json) that have no result: cancelled, or not finished yet."""
    planned = [str(e.get("sample_id")) for e in d.layout.info.get("samples") or [] if isinstance(e, dict)]
    done = set(d.samples["sample_id"].astype(str)) if len(d.samples) else set()
    return [sid for sid in planned if sid not in done]


def _counts_line(d: ReportData, unfinished: list[str]) -> str:
    s = d.samples
    masked = sum(is_masked(status, failure) for status, failure in zip(s["status"], s["failure"]))
    parts = [f"{int((s['status'] == 'completed').sum())} completed", f"{int((s['status'] == 'timeout').sum())} "
             f"timed out", f"{masked} masked (weight 0: an error or an infrastructure failure)"]
    outcome = d.layout.info.get("outcome") or {}
    if unfinished and outcome.get("status"):
        parts.append(f"{len(unfinished)} cancelled (never finished: the batch ended {outcome['status']})")
    elif unfinished:
        parts.append(f"{len(unfinished)} not finished yet (the batch is still running, or did not record how "
                     "it ended)")
    total = len(s) + len(unfinished)
    ended = f"; batch {outcome['status']}" if outcome.get("status") else ""
    return note(f"{total} samples: " + ", ".join(parts) + ended + ".")


def _call_errors(d: ReportData, limit: int = 30) -> list[str]:
    """The LLM calls that failed (engine down, a prompt over the context, a refused request), with their text."""
    c = d.calls
    errors = c[c["error"].notna() & (c["error"].astype(str) != "")] if len(c) else c
    if errors.empty:
        return []
    rows = [[short(d, str(r.sample_id)), r.call_id, r.api, " ".join(str(r.error).split())[:300]]
            for r in errors.head(limit).itertuples()]
    more = f" (the first {limit} shown)" if len(errors) > limit else ""
    return [note(f"{len(errors)} LLM call(s) ended in an error{more}:"),
            table(["sample", "call", "api", "error"], rows)]


def _run_failure(d: ReportData) -> list[str]:
    """A `polar run` folder without trajectories: its status and why, from what the run left."""
    from polar.run.causes import cause_lines

    info = d.layout.info
    if d.layout.kind != "run" or not info:
        return []
    why = [f"run status {info.get('status')}, harness exit {info.get('exit_code')}"
           + (" (timed out)" if info.get("timed_out") else "")]
    if info.get("error"):
        why.append(str(info["error"]))
    why += cause_lines(d.layout.root, [Path(f) for f in info.get("files") or []])
    return [note(line) for line in why]


def _means(df: pd.DataFrame, key: str) -> list[tuple[str, float]]:
    g = df.groupby(key)["reward"]
    return [(f"{k} (n={n})", float(m)) for (k, m), n in zip(g.mean().items(), g.size())]


def rewards(d: ReportData) -> str:
    s = d.samples[d.samples["reward"].notna()] if len(d.samples) else d.samples
    if s.empty:
        return section("rewards", "Rewards", [note("No rewards in this run: the samples were not scored "
                                                   "(rewards come from task evaluators or `--rewards`).")])
    return section("rewards", "Reward per task and per harness", [
        bars("reward-task", "Mean reward per task", _means(s, "task_id")),
        bars("reward-harness", "Mean reward per harness", _means(s, "harness"))])


def groups(d: ReportData) -> str:
    t = d.trajectories
    scored = t[t["reward"].notna()]
    if scored.empty:
        return section("groups", "Groups", [note("No rewards, so no group spread or advantages.")])
    first = scored.drop_duplicates("session_id")
    spread = [(f"{short(d, g)} (n={len(p)})", [float(v) for v in p["reward"]]) for g, p in first.groupby("group_id")]
    adv = [(short(d, g), [float(v) for v in p["advantage"].dropna()]) for g, p in first.groupby("group_id")]
    how = ("as stored in the table" if d.advantage_source == "stored" else
           "computed here over the batch: reward − group mean (the stored parts were scored one sample at a time)")
    return section("groups", "Group reward spread and advantages", [
        strip("group-reward", "Reward per sample, by group (tick = group mean)", spread),
        strip("group-advantage", "Advantage per sample, by group", adv), note(f"Advantages {how}.")])


def _pct(values: pd.Series, q: float) -> float:
    return float(values.quantile(q)) if len(values) else float("nan")


def calls(d: ReportData) -> str:
    c = d.calls
    if c.empty:
        return section("calls", "Calls", [note("No CallRecords here (captures/ folder absent): per-call latency "
                                               "and tokens need the run's capture files.")])
    by = {h: p for h, p in c.groupby("harness")}
    rows = [[h, len(p), int(p["error"].notna().sum()), _pct(p["latency_ms"], .5), _pct(p["latency_ms"], .9),
             float(p["latency_ms"].max()), float(p["prompt_tokens"].mean()), float(p["output_tokens"].mean())]
            for h, p in by.items()]
    return section("calls", "Calls: latency and tokens", [
        table(["harness", "calls", "errors", "latency p50 ms", "p90 ms", "max ms", "prompt tokens/call",
               "sampled tokens/call"], rows),
        '<div class="pair">' + histogram("latency", "Latency per call", {h: list(p["latency_ms"]) for h, p in by.items()}, "ms"),
        scatter("call-tokens", "Tokens per call: prompt vs sampled",
                {h: list(zip(p["prompt_tokens"], p["output_tokens"])) for h, p in by.items()},
                "prompt tokens", "sampled") + "</div>"])


def trainer_tokens(d: ReportData) -> str:
    m = d.merge
    if m.empty:
        return section("trainer-tokens", "Trainer tokens", [note("No trajectories.")])
    per_request = int(d.calls.loc[d.calls["error"].isna(), ["prompt_tokens", "output_tokens"]].sum().sum()) \
        if len(d.calls) else int(m["per_request_tokens"].max())
    items = [("per_request", float(per_request))]
    items += [(k, float(v)) for k, v in m["tokens"].items() if k != "per_request"]
    body = [bars("trainer-tokens", "Tokens a trainer reads, per build", items, "tokens")]
    if "prefix_merge" in m.index and m.loc["prefix_merge", "tokens"]:
        ratio = per_request / float(m.loc["prefix_merge", "tokens"])
        body.append(note(f"per_request ÷ prefix_merge = {ratio:.2f}x "
                         f"({per_request - int(m.loc['prefix_merge', 'tokens']):,} tokens saved)."))
    return section("trainer-tokens", "Trainer tokens: per_request vs prefix_merge", body)


def chains(d: ReportData) -> str:
    m = d.merge
    if m.empty:
        return section("chains", "Chains", [note("No trajectories.")])
    from polar_traj.chains import REASONS, START_KINDS

    row = m.loc["prefix_merge"] if "prefix_merge" in m.index else m.iloc[0]
    items = [(f"start: {k}", float(row.get(k, 0))) for k in START_KINDS]
    items += [(f"break: {r}", float(row.get(f"break_{r}", 0))) for r in REASONS]
    return section("chains", "Chain starts and breaks by reason", [
        bars("chains", f"Chains ({row.name}): {int(row['calls'])} calls -> {int(row['trajectories'])} trajectories",
             items, "chains")])


def stages(d: ReportData) -> str:
    s = d.samples
    timed = [(short(d, str(r.sample_id)), _wall(r.timings or {})) for r in s.itertuples()] if len(s) else []
    timed = [(k, t) for k, t in timed if t]
    if not timed:
        return section("stages", "Stage timings", [note("No stage timings: they come from the samples' result "
                                                        "JSON (prepare/run/evaluate/postrun), absent here.")])
    keys = [k for k in STAGES if any(k in t for _, t in timed)]
    keys += sorted({k for _, t in timed for k in t} - set(keys) - {"total_s"})
    return section("stages", "Stage timings per sample", [stacked("stages", "Seconds per stage", timed, keys, "s")])


def samples_table(d: ReportData) -> str:
    s = d.samples
    if s.empty:
        return section("samples", "Samples", [note("No samples.")])
    head = ["sample", "task", "group", "harness", "status", "failure", "reward", "advantage", "calls",
            "trajectories", "sampled tokens", "seconds"]
    rows = []
    for r in s.itertuples():
        secs = _seconds(r.timings or {})
        name = escape(short(d, str(r.sample_id)))
        link = (f'<a href="#traj={escape(str(r.trajectory_id), quote=True)}">{name}</a>'
                if isinstance(r.trajectory_id, str) else name)
        cells = [r.task_id, short(d, str(r.group_id)), r.harness, r.status, r.failure, r.reward, r.advantage, r.calls,
                 r.trajectories, r.trained_tokens, secs if r.timings else None]
        rows.append(f"<tr><td>{link}</td>" + "".join(
            f'<td data-v="{escape(_sort_key(v), quote=True)}">{escape(_cell(v))}</td>' for v in cells) + "</tr>")
    thead = "".join(f'<th title="click to sort">{escape(h)}</th>' for h in head)
    return section("samples", "Samples (click a column to sort, a sample to see its tokens)", [
        f'<table class="sortable" id="sample-table"><thead><tr>{thead}</tr></thead>'
        f'<tbody>{"".join(rows)}</tbody></table>'])


def _wall(timings: dict[str, Any]) -> dict[str, float]:
    """The stages' wall seconds; their host CPU (`<stage>_cpu_s`) is another measure, not more time."""
    return {k: float(v) for k, v in timings.items() if isinstance(v, (int, float)) and not k.endswith("_cpu_s")}


def _seconds(timings: dict[str, Any]) -> float:
    if isinstance(timings.get("total_s"), (int, float)):
        return float(timings["total_s"])
    return float(sum(_wall(timings).values()))


def _sort_key(v: Any) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return ""
    return repr(float(v)) if isinstance(v, (int, float)) else str(v)


def footer(d: ReportData) -> str:
    return f'<footer>polar report, {time.strftime("%Y-%m-%d %H:%M:%S %Z")}. Trajectories: ' \
           f'{escape(str(d.layout.parquet or "none"))}</footer>'


SECTIONS = (header, status, rewards, groups, calls, trainer_tokens, chains, stages, samples_table)
