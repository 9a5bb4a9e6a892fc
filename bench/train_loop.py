"""The RL loop on a CPU: TRL's GRPOTrainer trains the tiny model on Polar's rollouts of the vowel task
(polar/trl/task.py) for STEPS steps, synchronous (rollouts, then one update, then the weight sync through the
fence), then with the next step's rollouts overlapping training. Writes bench/train_loop.md (the reward per
step, where a step's time goes, the weight sync's cost) and bench/train_loop.json. Not part of `make bench`
(it trains for minutes).

    .venv/bin/python bench/train_loop.py [--steps 25] [--groups 2] [--group-size 4] [--modes sync,overlap]
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
    lines = ["| step | reward mean | logprob err | ratio mean / max | rows' version | rollout s | train s | sync s |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in reports:
        bar = "#" * round(20 * r.reward_mean)
        lines.append(f"| {r.step} | {r.reward_mean:.3f} `{bar}` | {r.logprob_err:.1e} | {r.ratio_mean:.2f} / "
                     f"{r.ratio_max:.1f} | {','.join(map(str, r.row_versions))} | {r.wait_s:.1f} | {r.train_s:.2f} "
                     f"| {r.sync_s:.2f} |")
    return lines


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=25)
    p.add_argument("--groups", type=int, default=2)
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--modes", default="sync,overlap", help="sync: rollouts, then train; overlap: the next "
                   "step's rollouts run while this one trains")
    args = p.parse_args()
    warnings.filterwarnings("ignore", category=FutureWarning)
    from examples.trl_grpo import run_local
    from polar.trl.grpo import TrainConfig, summarize, summary_line

    md, raw = [f"# Train loop ({args.steps} steps x {args.groups} groups x {args.group_size} samples, lr "
               f"{TrainConfig.learning_rate}, {TrainConfig.max_tokens} tokens, 2-core CPU shared with other work)"], {}
    for mode in args.modes.split(","):
        config = TrainConfig(BENCH.parent / "fixtures" / "tiny-qwen2", args.steps, args.groups, args.group_size,
                             overlap=mode == "overlap")
        t0 = time.monotonic()
        with tempfile.TemporaryDirectory(prefix="polar-train-loop-") as tmp:
            reports = run_local(Path(tmp), config, on_step=lambda r: print(mode, r.line(), flush=True))
        s = summarize(reports)
        s["wall_s"] = time.monotonic() - t0
        md += ["", f"## {mode}", "", summary_line(s) + f"; wall {s['wall_s']:.0f}s.", "", *table(reports)]
        raw[mode] = {"config": {**asdict(config), "model": str(config.model)}, "summary": s,
                     "steps": [asdict(r) for r in reports]}
        print(mode, summary_line(s), flush=True)
    (BENCH / "train_loop.md").write_text("\n".join(md) + "\n")
    (BENCH / "train_loop.json").write_text(json.dumps(raw, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
