"""`polar train`: GRPO on any task set, each step's rollouts from the rollout service, the task's evaluator the
reward, the weights synced to the engines through the fence (polar/trl/grpo.py). On one machine by default (a
private Redis, the reference server serving --model, one worker node, all stopped at the end), or against a
running service (--broker and --engine). One line per step; OUT/steps.json after every step; `polar report OUT`
draws the reward, importance ratio and staleness per step.

    polar train --steps 20                                  # the built-in vowel task, the tiny model, 1-2 min
    polar train --tasks tasks.yaml --model DIR --adapter pi --steps 50 --group-size 8 --groups 4 --overlap
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from contextlib import ExitStack
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable

from polar_traj import atomic

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_MODEL = ROOT / "fixtures" / "tiny-qwen2"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="train a model with GRPO on a task set, rollouts from Polar", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tasks", type=Path, help="tasks file (YAML or JSONL), a Harbor task directory or a folder of "
                                              "them (default: the built-in vowel task, one per group)")
    p.add_argument("--model", type=Path, default=DEFAULT_MODEL, help="model directory: the trainer starts from it "
                                                                     "and, locally, the reference server serves it")
    p.add_argument("--adapter", help="harness adapter for every task (default: each task's own)")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--group-size", type=int, default=4, help="samples per task (the GRPO group)")
    p.add_argument("--groups", type=int, default=2, help="tasks per step (cycling through the task set)")
    p.add_argument("--lr", type=float, default=3e-2)
    p.add_argument("--max-tokens", type=int, default=16, help="tokens per LLM call")
    p.add_argument("--overlap", action="store_true",
                   help="run the next step's rollouts while this step trains (rows up to a version stale, corrected "
                        "by the recorded logprobs)")
    p.add_argument("--max-staleness", type=int, help="do not train calls more than this many versions old")
    p.add_argument("--tis-cap", type=float, default=2.0, help="truncate importance weights at this value")
    p.add_argument("--no-correction", action="store_true",
                   help="train as TRL's GRPOTrainer would without vLLM (its own logprobs as the old ones); for "
                        "comparison")
    p.add_argument("--concurrency", type=int, default=2, help="local node: samples at once")
    p.add_argument("--broker", help="a running service's broker (Redis); default: a private one on this machine")
    p.add_argument("--sessions", help="with --broker: its sessions/fence Redis (default: the broker's server, db 0)")
    p.add_argument("--engine", action="append", help="with --broker: an engine replica's URL (repeat for each); "
                                                     "it must read the weights from OUT/weights")
    p.add_argument("--out", type=Path, help="run folder (default: runs/train-<time>)")
    p.set_defaults(func=run)


def check_args(args: argparse.Namespace) -> None:
    """ValueError naming the first argument a user must fix."""
    for name in ("steps", "group_size", "groups", "concurrency"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} {getattr(args, name)}: expected 1 or more")
    if args.group_size < 2:
        raise ValueError(f"--group-size {args.group_size}: GRPO compares samples in a group, expected 2 or more")
    if args.max_staleness is not None and args.max_staleness < 0:
        raise ValueError(f"--max-staleness {args.max_staleness}: expected 0 or more")
    if args.tis_cap <= 0:
        raise ValueError(f"--tis-cap {args.tis_cap}: expected a positive number")
    if not (args.model / "config.json").is_file():
        raise ValueError(f"--model {args.model}: no config.json there (a transformers model directory)")
    if args.tasks is not None and not args.tasks.exists():
        raise ValueError(f"--tasks {args.tasks}: not found")
    if bool(args.broker) != bool(args.engine):
        raise ValueError("--broker and --engine go together: a running service's broker and its engines")


def train_run(out: Path, config: Any, tasks: Path | None = None, adapter: str | None = None,
              broker: str | None = None, sessions: str | None = None, engines: list[str] | None = None,
              concurrency: int = 2, on_step: Callable[[Any], None] | None = None) -> list[Any]:
    """`polar.trl.grpo.train` on `tasks` (None: the vowel task, one per group), locally or on a running service;
    writes OUT/steps.json after each step (whole or not at all)."""
    from polar.client import PolarClient
    from polar.trl.grpo import train
    from polar.trl.local import local_cluster
    from polar.trl.task import write_tasks

    out.mkdir(parents=True, exist_ok=True)
    if tasks is None:
        tasks = write_tasks(out / "tasks.yaml", config.groups_per_step)
    done: list[Any] = []

    def step(report: Any) -> None:
        done.append(report)
        atomic.write_text(out / "steps.json", json.dumps([asdict(r) for r in done], indent=1))
        if on_step is not None:
            on_step(report)

    with ExitStack() as stack:
        if broker is None:
            c = stack.enter_context(local_cluster(out / "services", config.model, concurrency))
            broker, sessions, engines = c.broker, c.sessions, [c.engine]
        return train(PolarClient(broker, sessions), list(engines or []), tasks, out, config, step, adapter)


def print_step(report: Any) -> None:
    """A step's line, and a warning on stderr when it taught nothing (polar.trl.grpo.zero_signal)."""
    from polar.trl.grpo import zero_signal

    print(report.line(), flush=True)
    if (warning := zero_signal(report)) is not None:
        print(warning, file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    import warnings

    try:
        check_args(args)
    except ValueError as e:
        print(f"polar train: {e}", file=sys.stderr)
        return 2
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    warnings.filterwarnings("ignore", category=FutureWarning)  # transformers 5 renames TRL still calls
    from polar.trl.grpo import TrainConfig, summarize, summary_line

    out = args.out or Path("runs") / f"train-{time.strftime('%Y%m%d-%H%M%S')}"
    config = TrainConfig(args.model.resolve(), args.steps, args.groups, args.group_size, args.lr, args.max_tokens,
                         overlap=args.overlap, max_staleness=args.max_staleness, tis_cap=args.tis_cap,
                         correction=not args.no_correction)
    where = f"broker {args.broker}" if args.broker else "local: private Redis, polar serve, one node"
    print(f"polar train: {args.steps} steps x {args.groups} groups x {args.group_size} samples of "
          f"{args.tasks or 'the vowel task'}, {where}, out {out}", flush=True)
    t0 = time.monotonic()
    try:
        reports = train_run(out, config, args.tasks, args.adapter, args.broker, args.sessions, args.engine,
                            args.concurrency, on_step=print_step)
    except (ValueError, KeyError, OSError, RuntimeError, TimeoutError) as e:
        print(f"polar train: {e}", file=sys.stderr)
        return 1
    print(f"polar train: {summary_line(summarize(reports))}; wall {time.monotonic() - t0:.0f}s", flush=True)
    print(f"polar train: steps in {out / 'steps.json'}; charts: polar report {out}")
    return 0
