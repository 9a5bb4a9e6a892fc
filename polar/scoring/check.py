"""`polar tasks check DATASET`: is every task of a task set scored right, as its authors ship it? The check Harbor's
users run with the oracle agent, in Polar's verifier: per task, its oracle (polar/scoring/oracle.py) must score the
top reward with none of its work dropped, and doing nothing must score the bottom one (a completed, trainable 0).
Both run as a sample's verify stage runs (fresh sandboxes, the allowlist, Polar's observer); each run's folder
keeps its result.json. Exits 1 on any miss, 2 when the task set cannot be read. `polar redteam` runs it first.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from polar.sandbox.runtime import RUNTIMES
from polar.scoring.oracle import OracleResult, oracle_script, run_oracle
from polar.tasks.task import TaskError, TaskSpec

COLUMNS = ("task", "oracle", "dropped", "nothing", "oracle s", "nothing s", "verdict")


@dataclass(frozen=True)
class Check:
    task: str
    oracle: float | None  # the oracle's reward; None: the task set ships no oracle for it
    dropped: tuple[str, ...]  # the oracle's changes the allowlist did not admit
    nothing: float | None  # doing nothing's reward
    oracle_s: float
    nothing_s: float
    verdict: str  # ok | MISS | no oracle
    why: str = ""  # what missed, in one line

    def cells(self) -> tuple[str, ...]:
        shown = lambda r: "-" if r is None else f"{r:g}"  # noqa: E731
        return (self.task, shown(self.oracle), str(len(self.dropped)), shown(self.nothing), f"{self.oracle_s:.1f}",
                f"{self.nothing_s:.1f}", self.verdict)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("tasks", help="check a task set: every oracle scores 1, doing nothing 0", description=__doc__)
    verbs = p.add_subparsers(dest="verb", required=True)
    c = verbs.add_parser("check", help="run each task's oracle and a do-nothing solution through the verifier",
                         description=__doc__)
    c.add_argument("tasks", type=Path, help="task file (YAML/JSONL, docs/tasks.md) or Harbor task folder")
    c.add_argument("--runtime", default="auto", choices=RUNTIMES, help="runtime to run in (default auto)")
    c.add_argument("--tasks-root", type=Path, help="where the tasks' files may lie (default: POLAR_TASKS_ROOT, else "
                                                   "the task file's folder and the current directory)")
    c.add_argument("--task-id", action="append", help="only this task of the set (repeatable)")
    c.add_argument("--jobs", type=int, default=2, help="runs at once (default 2)")
    c.add_argument("--out", type=Path, help="folder for the runs (default runs/tasks-check-<time>)")
    c.add_argument("--json", action="store_true", help="print the rows as JSON instead of a table")
    c.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from polar.tasks.load import load_tasks

    try:
        tasks = load_tasks(args.tasks, args.tasks_root)
        if args.task_id:
            if unknown := set(args.task_id) - {t.task_id for t in tasks}:
                raise TaskError(f"--task-id: no task {', '.join(sorted(unknown))} in {args.tasks}")
            tasks = [t for t in tasks if t.task_id in args.task_id]
    except (TaskError, ValueError) as e:
        print(f"polar tasks check: {e}", file=sys.stderr)
        return 2
    out = (args.out or Path("runs") / f"tasks-check-{time.strftime('%Y%m%d-%H%M%S')}").resolve()
    print(f"polar tasks check: {len(tasks)} tasks on {args.runtime}, {max(1, args.jobs)} at a time; runs in {out}",
          file=sys.stderr, flush=True)
    checks = check_tasks(tasks, args.runtime, out, max(1, args.jobs),
                         on_check=lambda c: print(f"  {c.verdict:9} {c.task} ({c.oracle_s + c.nothing_s:.0f}s)"
                                                  + (f": {c.why}" if c.why else ""), file=sys.stderr, flush=True))
    if args.json:
        print(json.dumps([dataclasses.asdict(c) for c in checks], indent=2))
    else:
        print("\n".join(table(checks)))
    misses = [c for c in checks if c.verdict == "MISS"]
    print(f"polar tasks check: {len(checks) - len(misses)} of {len(checks)} tasks scored right" +
          (f"; {sum(c.verdict == 'no oracle' for c in checks)} ship no oracle" if any(
              c.verdict == "no oracle" for c in checks) else ""), file=sys.stderr)
    return 1 if misses else 0


def check_tasks(tasks: list[TaskSpec], runtime: str, out: Path, jobs: int, on_check=lambda c: None) -> list[Check]:
    """Each task's oracle and do-nothing run, `jobs` at a time; one Check per task, in the tasks' order."""
    out.mkdir(parents=True, exist_ok=True)

    def one(task: TaskSpec) -> Check:
        check = check_task(task, runtime, out / task.task_id[:100])
        on_check(check)
        return check
    with ThreadPoolExecutor(jobs) as pool:
        return list(pool.map(one, tasks))


def check_task(task: TaskSpec, runtime: str, folder: Path) -> Check:
    low, top = task.reward_range
    start = time.monotonic()
    oracle: OracleResult | None = None
    solve = oracle_script(task, folder / "oracle-script")
    try:
        if solve is not None or any(s.solution for s in task.steps):
            oracle = run_oracle(task, solve, runtime, folder / "oracle")
    except Exception as e:  # noqa: BLE001 - a task that cannot run its oracle is a miss, named
        return Check(task.task_id, None, (), None, time.monotonic() - start, 0.0, "MISS",
                     f"the oracle could not run: {type(e).__name__}: {e}"[:300])
    oracle_s, start = time.monotonic() - start, time.monotonic()
    try:
        idle = _do_nothing(task, folder)
        nothing = run_oracle(*idle, runtime, folder / "nothing", own=False).evaluation.reward
    except Exception as e:  # noqa: BLE001
        return Check(task.task_id, oracle and oracle.evaluation.reward, oracle.dropped if oracle else (), None,
                     oracle_s, time.monotonic() - start, "MISS", f"doing nothing could not run: {e}"[:300])
    nothing_s = time.monotonic() - start
    why = []
    if oracle is not None and oracle.evaluation.reward != top:
        why.append(f"the oracle scored {oracle.evaluation.reward:g} (solve.sh exit {oracle.exit_code}): "
                   f"{_last_line(oracle.evaluation.output)}")
    if oracle is not None and oracle.dropped:
        why.append("the allowlist dropped the oracle's " + "; ".join(oracle.notes or oracle.dropped))
    if nothing != low:
        why.append(f"doing nothing scored {nothing:g}, not {low:g}")
    verdict = "MISS" if why else ("ok" if oracle is not None else "no oracle")
    return Check(task.task_id, oracle.evaluation.reward if oracle else None, oracle.dropped if oracle else (),
                 nothing, oracle_s, nothing_s, verdict, "; ".join(why)[:600])


def _do_nothing(task: TaskSpec, folder: Path) -> tuple[TaskSpec, Path | None]:
    """The task with a solve.sh that does nothing (each step's too)."""
    script = folder / "nothing-script" / "solve.sh"
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text("#!/bin/bash\ntrue\n")
    if task.steps:
        return dataclasses.replace(task, steps=tuple(dataclasses.replace(s, solution=None) for s in task.steps)), None
    return task, script


def _last_line(output: str) -> str:
    lines = [line for line in output.strip().splitlines() if line.strip()]
    return lines[-1][:200] if lines else "(no output)"


def table(checks: list[Check]) -> list[str]:
    body = [COLUMNS, *(c.cells() for c in checks)]
    widths = [max(len(line[i]) for line in body) for i in range(len(COLUMNS))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in body]
    lines = [lines[0], "  ".join("-" * w for w in widths), *lines[1:]]
    return lines + [f"{c.task}: {c.why}" for c in checks if c.why]
