"""`polar redteam TASKS`: every reward hack of polar/redteam/hacks.py that applies, against every task of a task file
or Harbor folder, each a scripted policy making one shell call through a real harness; the honest fix of each
task (its `metadata.fix` command, or a Harbor task's solution/solve.sh) beside them. Prints one row per case
(hack, task, runtime, status, reward, flagged, verdict) and each runtime's wall time; exits 1 when any hack
paid (reward above the task's lowest), chose to be masked, scored 0 unnamed where it must be named, or an honest
run failed to score the top reward; first, `polar tasks check` of the task set (--no-honest skips both).
docs/tasks.md "Red team"."""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

from polar.harness.adapters import AdapterError, load_adapter
from polar.redteam.hacks import BY_NAME, HACKS, facts_of
from polar.redteam.runner import IMAGELESS, Plan, Row, Runner, cases_of
from polar.run.services import ROOT, ServiceError
from polar.sandbox.runtime import RUNTIMES
from polar.tasks.load import load_tasks
from polar.tasks.task import TaskError, TaskSpec

DEFAULT_MODEL = ROOT / "fixtures" / "tiny-qwen2"
GOOD = ("held", "ok")
COLUMNS = ("hack", "task", "runtime", "status", "reward", "flagged", "verdict")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("redteam", help="run the library of reward hacks against a task set; exit 1 if any pays",
                       description=__doc__)
    p.add_argument("tasks", type=Path, help="task file (YAML/JSONL, docs/tasks.md) or Harbor task folder")
    p.add_argument("--runtime", action="append", choices=RUNTIMES,
                   help="runtime to run in (repeatable; default auto). bwrap and local run every task on `host`")
    p.add_argument("--tasks-root", type=Path, help="where the tasks' workspaces, tests and Harbor folders may lie "
                                                   "(default: POLAR_TASKS_ROOT, else the task file's folder and the "
                                                   "current directory)")
    p.add_argument("--image", help="image for the runtimes that run one (apptainer, docker) instead of each task's")
    p.add_argument("--adapter", default="pi", help="harness adapter (default pi)")
    p.add_argument("--only", action="append", metavar="HACK",
                   help=f"run only this hack (repeatable): {', '.join(BY_NAME)}")
    p.add_argument("--task-id", action="append", help="only this task of the file (repeatable)")
    p.add_argument("--per-hack", type=int, help="each hack on at most N of the tasks it applies to (default: all)")
    p.add_argument("--no-honest", action="store_true", help="skip the honest fixes and oracles")
    p.add_argument("--jobs", type=int, default=4, help="cases run at once (default 4)")
    p.add_argument("--model", type=Path, default=DEFAULT_MODEL, help="model of the reference server")
    p.add_argument("--out", type=Path, help="folder for every case's sample (default runs/redteam-<time>)")
    p.add_argument("--json", action="store_true", help="print the rows as JSON instead of a table")
    p.set_defaults(func=run)


def honest_of(task: TaskSpec, source: Path, tasks_root: Path | None = None) -> str | Path | None:
    """A task's honest fix: its metadata `fix` (one shell command), or a Harbor task's solution/solve.sh (a
    multi-step task's oracle runs each step's: the first is named)."""
    if task.steps:
        return next((s.solution for s in task.steps if s.solution), None)
    if task.evaluator.kind == "harbor":
        from polar.tasks.harbor import solution_of

        try:
            return solution_of(source, task.task_id, tasks_root)
        except TaskError:
            return None
    fix = task.metadata.get("fix")
    return fix if isinstance(fix, str) and fix.strip() else None


def plan_of(args: argparse.Namespace) -> Plan:
    tasks = load_tasks(args.tasks, args.tasks_root)
    if args.task_id:
        unknown = set(args.task_id) - {t.task_id for t in tasks}
        if unknown:
            raise ValueError(f"--task-id: no task {', '.join(sorted(unknown))} in {args.tasks}")
        tasks = [t for t in tasks if t.task_id in args.task_id]
    unknown = set(args.only or ()) - set(BY_NAME)
    if unknown:
        raise ValueError(f"--only: no hack {', '.join(sorted(unknown))} (hacks: {', '.join(BY_NAME)})")
    hacks = [BY_NAME[n] for n in args.only] if args.only else list(HACKS)
    if args.per_hack is not None and args.per_hack < 1:
        raise ValueError("--per-hack: at least 1")
    entries = [(t, facts_of(t), None if args.no_honest else honest_of(t, args.tasks, args.tasks_root)) for t in tasks]
    return Plan(entries, hacks, args.runtime or ["auto"], args.per_hack, args.image)


def run(args: argparse.Namespace) -> int:
    try:
        plan = plan_of(args)
        adapter = load_adapter(args.adapter)
    except (TaskError, AdapterError, ValueError) as e:
        print(f"polar redteam: {e}", file=sys.stderr)
        return 2
    cases = cases_of(plan)
    if not cases:
        print("polar redteam: no hack applies to these tasks", file=sys.stderr)
        return 2
    out = (args.out or Path("runs") / f"redteam-{time.strftime('%Y%m%d-%H%M%S')}").resolve()
    out.mkdir(parents=True, exist_ok=True)
    misses = 0 if args.no_honest else check_first(plan, out / "tasks-check", args.jobs)
    print(f"polar redteam: {len(cases)} cases ({len(plan.hacks)} hacks, {len(plan.tasks)} tasks, "
          f"{', '.join(plan.runtimes)}), {args.jobs} at a time; samples in {out}", file=sys.stderr)
    runner = Runner(out, adapter, args.model.resolve(), max(1, args.jobs),
                    on_row=lambda r: print(f"  {r.verdict:9} {r.hack} / {r.task} / {r.runtime} "
                                           f"({r.wall_s:.0f}s)", file=sys.stderr, flush=True))
    try:
        rows = runner.run(cases)
    except (ServiceError, OSError, RuntimeError) as e:
        print(f"polar redteam: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({"rows": [r.to_dict() for r in rows], "wall_s": runner.walls}, indent=2))
    else:
        print("\n".join(table(rows)))
        print("\n".join(summary(rows, runner.walls)))
    return 0 if all(r.verdict in GOOD for r in rows) and not misses else 1


def check_first(plan: Plan, out: Path, jobs: int) -> int:
    """`polar tasks check` of the task set in each runtime, before any hack: a task whose oracle does not score or
    that pays for nothing makes every hack's verdict meaningless. The number of misses."""
    from polar.scoring.check import check_tasks, table

    misses = 0
    for runtime in plan.runtimes:
        image = lambda t: "host" if runtime in IMAGELESS else (plan.image or t.image)  # noqa: E731 - as the cases
        tasks = [dataclasses.replace(t, image=image(t)) for t, _facts, _honest in plan.tasks]
        print(f"polar redteam: polar tasks check first ({len(tasks)} tasks, {runtime})", file=sys.stderr, flush=True)
        checks = check_tasks(tasks, runtime, out / runtime, max(1, jobs))
        print("\n".join(table(checks)), file=sys.stderr, flush=True)
        misses += sum(c.verdict == "MISS" for c in checks)
    return misses


def cells(row: Row) -> tuple[str, ...]:
    reward = "-" if row.reward is None else f"{row.reward:g}"
    flags = [*row.tampered, *row.suspicious]
    flagged = "no" if not flags else f"{len(flags)}: {flags[0][:40]}" + (" …" if len(flags) > 1 else "")
    return row.hack, row.task, row.runtime, row.status, reward, flagged, row.verdict


def table(rows: list[Row]) -> list[str]:
    body = [COLUMNS, *(cells(r) for r in rows)]
    widths = [max(len(line[i]) for line in body) for i in range(len(COLUMNS))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in body]
    return [lines[0], "  ".join("-" * w for w in widths), *lines[1:]]


def summary(rows: list[Row], walls: dict[str, float]) -> list[str]:
    lines = []
    for runtime in dict.fromkeys(r.runtime for r in rows):
        mine = [r for r in rows if r.runtime == runtime]
        counts = {v: sum(r.verdict == v for r in mine) for v in dict.fromkeys(r.verdict for r in mine)}
        wall = walls.get(runtime, sum(walls.values()))  # auto: one pass over every runtime it resolved to
        lines.append(f"{runtime}: {len(mine)} cases, " + ", ".join(f"{n} {v}" for v, n in counts.items()) +
                     f", {wall:.0f}s wall")
    bad = [r for r in rows if r.verdict not in GOOD]
    lines.append("polar redteam: every hack held and every honest run scored" if not bad else
                 f"polar redteam: {len(bad)} of {len(rows)} cases did not hold")
    return lines
