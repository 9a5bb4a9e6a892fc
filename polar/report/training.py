"""`polar report` of a `polar train` run folder (its steps.json): the reward per step, the importance ratio
against the recorded logprobs (mean, max, the share capped), the rows by version lag and the calls masked as
stale, and where each step's time went. One self-contained page, inline SVG, nothing fetched."""
from __future__ import annotations

import json
from html import escape
from pathlib import Path
from typing import Any

from polar.report.data import ReportError
from polar.report.page import CSS
from polar.report.sections import note, section, table
from polar.report.svg import scatter, stacked

STEPS_FILE = "steps.json"


def is_train_run(source: Path) -> bool:
    return source.is_dir() and (source / STEPS_FILE).is_file()


def read_steps(source: Path) -> list[dict[str, Any]]:
    try:
        steps = json.loads((source / STEPS_FILE).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ReportError(f"{source / STEPS_FILE}: not readable as JSON: {e}") from e
    if not isinstance(steps, list) or not steps or not all(isinstance(s, dict) and "reward_mean" in s for s in steps):
        raise ReportError(f"{source / STEPS_FILE}: expected a list of step reports (polar train writes it)")
    return steps


def _lags(step: dict[str, Any]) -> dict[str, float]:
    return {f"lag {k}" if int(k) >= 0 else "no version": float(v) for k, v in step.get("rows_per_lag", {}).items()}


def _points(steps: list[dict[str, Any]], key: str, scale: float = 1.0) -> list[tuple[float, float]]:
    """(step, value) where the step has the value (a NaN, as JSON's NaN, is left out)."""
    return [(float(s["step"]), scale * float(s[key])) for s in steps if s.get(key) is not None and s[key] == s[key]]


def _mean(steps: list[dict[str, Any]], key: str) -> float:
    return sum(s[key] for s in steps) / len(steps)


def render_training(source: Path) -> str:
    steps = read_steps(source)
    lag_names = sorted({k for s in steps for k in _lags(s)}, key=lambda k: (k == "no version", k))
    masked = sum(s.get("masked_calls", 0) for s in steps)
    first, last = steps[: min(5, len(steps))], steps[-min(5, len(steps)):]
    step_s = _mean(steps, "wait_s") + _mean(steps, "train_s") + _mean(steps, "sync_s")
    summary = table(["", ""], [
        ["steps", len(steps)], ["rows per step", steps[0]["rows"]],
        [f"reward, first {len(first)} steps", _mean(first, "reward_mean")],
        [f"reward, last {len(last)} steps", _mean(last, "reward_mean")],
        ["seconds per step", step_s], ["trainer waiting for rollouts", f"{100 * _mean(steps, 'wait_s') / step_s:.0f}%"],
        ["calls masked as stale", masked],
    ], "kv")
    charts = [
        scatter("reward", "reward mean per step", {"reward": _points(steps, "reward_mean")}, "step", "reward",
                joined=True),
        scatter("is-ratio", "importance ratio exp(trainer - recorded) before each update",
                {"mean": _points(steps, "is_mean"), "max": _points(steps, "is_max")}, "step", "ratio", joined=True),
        scatter("is-capped", "share of trained tokens whose ratio was capped",
                {"capped": _points(steps, "is_capped", 100.0)}, "step", "% capped", joined=True),
        stacked("lags", "trained rows by version lag (trainer version - the row's oldest call's)",
                [(f"step {s['step']}", _lags(s)) for s in steps], lag_names),
        stacked("time", "where each step's time went", [(f"step {s['step']}", {
            "rollout": s["wait_s"], "train": s["train_s"], "sync": s["sync_s"]}) for s in steps],
            ["rollout", "train", "sync"], "s"),
    ]
    rows = [[s["step"], s["reward_mean"], f"{s['logprob_err']:.1e}", s.get("is_mean"), s.get("is_max"),
             100 * s.get("is_capped", 0.0), ", ".join(f"{k}: {v:.0f}" for k, v in _lags(s).items()),
             s.get("masked_calls", 0), s["engine_version"], s["wait_s"], s["train_s"], s["sync_s"]] for s in steps]
    body = [section("summary", "Run", [summary, note("logprob err: the largest gap between the trainer's and the "
                                                     "engine's logprob of a token sampled at the trainer's own "
                                                     "version (0 up to float error)")]),
            section("curves", "Per step", ['<div class="pair">', *charts, "</div>"]),
            section("steps", "Steps", [table(["step", "reward", "logprob err", "ratio mean", "ratio max", "% capped",
                                              "rows by lag", "masked calls", "engine version", "rollout s",
                                              "train s", "sync s"], rows)])]
    title = f"Polar training report: {source.resolve().name}"
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
            f'<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; style-src \'unsafe-inline\'">'
            f'<title>{escape(title)}</title><style>{CSS}</style></head><body><main><h1>{escape(title)}</h1>'
            f'{"".join(body)}</main></body></html>')
