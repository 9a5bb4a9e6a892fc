"""The RL loop on a CPU: TRL's GRPOTrainer trains the tiny model on Polar's rollouts (`polar train`'s loop,
workers/train.py) of two learnable tasks (polar/trl/task.py: vowels, brevity), in three modes: sync (rollouts,
then one update, then the weight sync through the fence), overlap (the next step's rollouts run while this one
trains; stale rows weighed by the truncated importance ratio against the recorded logprobs) and
overlap-uncorrected (the same without the weights: TRL's own logprobs as the old ones). Writes bench/train_loop.md
(per task and mode: reward first/last steps, wall per step, trainer wait, ratio statistics; the step tables) and
bench/train_loop.json. Not part of `make bench` (it trains for minutes).

    .venv/bin/python bench/train_loop.py [--steps 15] [--tasks vowels,brevity]
                                         [--modes sync,overlap,overlap-uncorrected]
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import warnings
from dataclasses import asdict
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH.parent))


def table(reports: list) -> list[str]:
    lines = ["| step | reward mean | logprob err | IS ratio mean / max | capped | rows by lag | rollout s | train s | "
             "sync s |", "|---:|---:|---:|---:|---:|---|---:|---:|---:|"]
    for r in reports:
        bar = "#" * round(20 * r.reward_mean)
        lags = ", ".join(f"{k}: {v}" for k, v in sorted(r.rows_per_lag.items()))
        lines.append(f"| {r.step} | {r.reward_mean:.3f} `{bar}` | {r.logprob_err:.1e} | {r.is_mean:.3f} / "
                     f"{r.is_max:.2f} | {100 * r.is_capped:.1f}% | {lags} | {r.wait_s:.1f} | {r.train_s:.2f} "
                     f"| {r.sync_s:.2f} |")
    return lines


MODES = {"sync": {}, "overlap": {"overlap": True},
         "overlap-uncorrected": {"overlap": True, "correction": False}}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=15)
    p.add_argument("--groups", type=int, default=2)
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--tasks", default="vowels,brevity")
    p.add_argument("--modes", default=",".join(MODES))
    args = p.parse_args()
    warnings.filterwarnings("ignore", category=FutureWarning)
    from polar.trl.grpo import TrainConfig, summarize, summary_line
    from polar.trl.task import write_tasks
    from workers.train import train_run

    md = [f"# Train loop ({args.steps} steps x {args.groups} groups x {args.group_size} samples, lr {args.lr}, "
          f"{TrainConfig.max_tokens} tokens, 2-core CPU)", "",
          "| task | mode | reward first 5 -> last 5 | s per step | x sync | trainer waiting | IS ratio mean / max | "
          "tokens capped | rows >= 1 version behind |", "|---|---|---|---:|---:|---:|---:|---:|---:|"]
    sections, raw = [], {}
    for kind in args.tasks.split(","):
        sync_step = None
        for mode in args.modes.split(","):
            config = TrainConfig(BENCH.parent / "fixtures" / "tiny-qwen2", args.steps, args.groups, args.group_size,
                                 args.lr, **MODES[mode])
            t0 = time.monotonic()
            with tempfile.TemporaryDirectory(prefix="polar-train-loop-") as tmp:
                tasks = write_tasks(Path(tmp) / "tasks.yaml", args.groups, kind=kind)
                reports = train_run(Path(tmp), config, tasks,
                                    on_step=lambda r: print(kind, mode, r.line(), flush=True))
            s = summarize(reports)
            s["wall_s"] = time.monotonic() - t0
            sync_step = s["step_s"] if mode == "sync" else sync_step
            ratio = f"{s['step_s'] / sync_step:.2f}" if sync_step else ""
            md.append(f"| {kind} | {mode} | {s['reward_first']:.3f} -> {s['reward_last']:.3f} | {s['step_s']:.2f} | "
                      f"{ratio} | {100 * s['wait_fraction']:.0f}% | {s['is_mean']:.3f} / {s['is_max']:.1f} | "
                      f"{100 * s['is_capped']:.1f}% | {s['lag1_rows']} |")
            sections += ["", f"## {kind}, {mode}", "", summary_line(s) + f"; wall {s['wall_s']:.0f}s.", "",
                         *table(reports)]
            raw[f"{kind}/{mode}"] = {"config": {**asdict(config), "model": str(config.model)}, "summary": s,
                                     "steps": [asdict(r) for r in reports]}
            print(kind, mode, summary_line(s), flush=True)
    (BENCH / "train_loop.md").write_text("\n".join(md + sections) + "\n")
    (BENCH / "train_loop.json").write_text(json.dumps(raw, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
