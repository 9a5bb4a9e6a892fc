"""Train the tiny model with TRL's GRPOTrainer on Polar's rollouts, on a CPU, in minutes.

Starts a private Redis, the reference server (fixtures/tiny-qwen2, free sampling at temperature 1) and one worker
node; each step submits GROUPS tasks x GROUP_SIZE samples of the vowel task (polar/trl/task.py: one curl call,
reward = fraction of vowels in the answer), trains one GRPO step and syncs the weights through the fence
(pause, safetensors, /update_weights_from_disk, resume). One line per step; a summary at the end.

    .venv/bin/python examples/trl_grpo.py --steps 20 --groups 2 --group-size 4 [--out runs/trl-grpo]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings
from dataclasses import asdict
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def run_local(out: Path, config, concurrency: int = 2,
              on_step=None) -> list:
    """`train` on one machine: a private Redis, `polar serve` with config.model and one worker node, started
    and stopped here; one vowel task per group (polar/trl/task.py)."""
    import yaml

    from polar.trl.grpo import train
    from polar.trl.local import local_cluster
    from polar.trl.task import write_tasks
    from workers.client import PolarClient  # here, not in polar/trl: the rollout service sits above polar/

    tasks = yaml.safe_load(write_tasks(out / "tasks.yaml", config.groups_per_step).read_text())["tasks"]
    with local_cluster(out / "services", config.model, concurrency) as c:
        return train(PolarClient(c.broker, c.sessions), [c.engine], tasks, out, config, on_step)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--groups", type=int, default=2, help="groups (tasks) per step")
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--lr", type=float, default=3e-2)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--overlap", action="store_true",
                   help="submit the next step's batch before training this one (its rows one version stale)")
    p.add_argument("--concurrency", type=int, default=2, help="the worker node's samples at once")
    p.add_argument("--out", type=Path, default=ROOT / "runs" / f"trl-grpo-{time.strftime('%Y%m%d-%H%M%S')}")
    args = p.parse_args(argv)
    warnings.filterwarnings("ignore", category=FutureWarning)  # transformers 5 renames TRL still calls

    from polar.trl.grpo import TrainConfig, summarize, summary_line

    config = TrainConfig(ROOT / "fixtures" / "tiny-qwen2", args.steps, args.groups, args.group_size, args.lr,
                         args.max_tokens, overlap=args.overlap)
    t0 = time.monotonic()
    print(f"== {args.steps} steps x {args.groups} groups x {args.group_size} samples, out {args.out}", flush=True)
    reports = run_local(args.out, config, args.concurrency, on_step=lambda r: print(r.line(), flush=True))
    (args.out / "steps.json").write_text(json.dumps([asdict(r) for r in reports], indent=1))
    print(f"== {summary_line(summarize(reports))}; wall {time.monotonic() - t0:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
