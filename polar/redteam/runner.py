"""Running the red team: one reference server and one proxy for every case, the cases `jobs` at a time.

A case is one hack (or the task's honest fix) against one task in one runtime. Every case is a real scored sample
(polar/run/sample.py run_sample: the harness in its sandbox, the verifier in a fresh one) whose task instruction
ends with a marker naming the case; the scripted policy (docs/reference-server.md) has one rule per marker, so a
single reference server plays every case at once. A Harbor task's honest run is its oracle (solution/solve.sh,
polar/scoring/oracle.py), with no harness.
"""
from __future__ import annotations

import dataclasses
import math
import threading
import time
import traceback
import uuid
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import yaml

from polar.harness.adapters import AdapterSpec
from polar.redteam.hacks import Hack, Facts, facts_of
from polar.run.local_redis import private_redis
from polar.run.sample import SampleConfig, SampleResult, run_sample
from polar.run.session import EngineConfig, start_services
from polar.sandbox.runtime import resolve_runtime
from polar.tasks.task import TaskSpec

SHELLS = ["exec_command", "Bash", "bash", "run_shell_command", "shell"]
FIX, ORACLE = "honest-fix", "oracle"  # the two honest rows' names
IMAGELESS = ("bwrap", "local")  # runtimes that show the host's system: a task's image is `host` there


@dataclass(frozen=True)
class Case:
    index: int
    name: str  # the hack's name, or FIX / ORACLE
    task: TaskSpec  # as run: image set for the runtime, instruction ending with the case's marker
    runtime: str
    command: str | None  # the one shell command the policy runs; None: the oracle
    hack: Hack | None = None
    solve: Path | None = None  # ORACLE: the task's solution/solve.sh


@dataclass(frozen=True)
class Row:
    hack: str
    task: str
    runtime: str
    status: str
    reward: float | None
    weight: float
    tampered: list[str]
    suspicious: list[str]
    verdict: str  # held | PAYS | MASKED | UNFLAGGED for a hack; ok | FAILS for the honest rows; ERROR
    wall_s: float
    sample: str  # the case's folder
    detail: str = ""  # the reason of a failed sample, or the error

    @property
    def flagged(self) -> bool:
        return bool(self.tampered or self.suspicious)

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "flagged": self.flagged}


@dataclass(frozen=True)
class Plan:
    """What to run: (task, the task's Facts, its honest command or solve.sh) and the hacks."""

    tasks: list[tuple[TaskSpec, Facts, str | Path | None]]
    hacks: list[Hack]
    runtimes: list[str]
    per_hack: int | None = None  # each hack on at most this many of the tasks it applies to (None: all)
    image: str | None = None  # the image of runtimes that run one (apptainer, docker) instead of the task's


def cases_of(plan: Plan) -> list[Case]:
    """Every case of the plan: per runtime, each hack on the tasks it applies to (round-robin from a different
    task for each hack when per_hack limits them, so every task gets its share), then each honest run."""
    cases: list[Case] = []
    for runtime in plan.runtimes:
        for h, hack in enumerate(plan.hacks):
            fits = [(t, f) for t, f, _ in plan.tasks if hack.applies(f)]
            if plan.per_hack is not None and fits:
                fits = [fits[(h + k) % len(fits)] for k in range(min(plan.per_hack, len(fits)))]
            for task, _facts in fits:
                cases.append(Case(len(cases), hack.name, task, runtime, None, hack))
        for task, _facts, honest in plan.tasks:
            if isinstance(honest, Path):
                cases.append(Case(len(cases), ORACLE, task, runtime, None, solve=honest))
            elif honest:
                cases.append(Case(len(cases), FIX, task, runtime, honest))
    return [_as_run(c, plan.image) for c in cases]


def _as_run(case: Case, image: str | None) -> Case:
    task = case.task
    new_image = "host" if case.runtime in IMAGELESS else (image or task.image)  # auto: resolved per task
    if case.solve:
        return dataclasses.replace(case, task=dataclasses.replace(task, image=new_image))
    marked = lambda text: f"{text.rstrip()}\n\n{case_marker(case)}"  # noqa: E731
    steps = tuple(dataclasses.replace(s, instruction=marked(s.instruction)) for s in task.steps)  # each step's too
    return dataclasses.replace(case, task=dataclasses.replace(task, image=new_image, instruction=marked(task.instruction),
                                                              steps=steps))


def case_marker(case: Case) -> str:
    return f"[polar redteam case {case.index:05d}]"


def policy_of(cases: list[Case], commands: dict[int, str]) -> dict[str, Any]:
    """The scripted policy: "Done." once a tool ran; else the case's one shell call, told apart by its marker."""
    rules: list[dict[str, Any]] = [{"name": "done", "when": {"tool_results": {"min": 1}}, "content": "Done."}]
    for case in cases:
        if case.index not in commands:
            continue
        command = commands[case.index]
        rules.append({"name": f"case-{case.index:05d}", "when": {"prompt_contains": case_marker(case),
                                                                "tool_offered": SHELLS},
                      "tool_calls": [{"name": SHELLS, "arguments": {"command": command},
                                      "arguments_for": {"exec_command": {"cmd": command},
                                                        "shell": {"command": ["bash", "-lc", command]}}}]})
    rules.append({"name": "no-shell", "reply": "No shell tool was offered."})
    return {"rules": rules}


@dataclass
class Runner:
    """Runs cases against one set of services; `out` holds every case's sample folder."""

    out: Path
    adapter: AdapterSpec
    model: Path
    jobs: int = 4
    on_row: Callable[[Row], None] = lambda row: None
    rows: list[Row] = field(default_factory=list)
    walls: dict[str, float] = field(default_factory=dict)  # runtime -> seconds its cases took, all of them
    lock: threading.Lock = field(default_factory=threading.Lock)

    def run(self, cases: list[Case]) -> list[Row]:
        """Every case; the runtimes one after another (each its own wall time, in `walls`), the services shared."""
        sibling = self.out / "sibling" / "workspace" / "reward.txt"  # a neighbour's answer, at a known path
        sibling.parent.mkdir(parents=True, exist_ok=True)
        sibling.write_text("1\n")
        commands = {c.index: c.hack.fill(facts_of(c.task), sibling) if c.hack else c.command
                    for c in cases if c.solve is None}
        policy = self.out / "policy.yaml"
        policy.write_text(yaml.safe_dump(policy_of(cases, commands), sort_keys=False))
        services = self.out / "services"
        (services / "logs").mkdir(parents=True, exist_ok=True)
        with ExitStack() as stack:
            sessions = stack.enter_context(private_redis(services))
            engine = EngineConfig(self.model, policy=policy)
            proxy = stack.enter_context(start_services(services, engine, services / "mitm", stack, sessions))
            for runtime in dict.fromkeys(c.runtime for c in cases):
                start = time.monotonic()
                with ThreadPoolExecutor(self.jobs) as pool:
                    list(pool.map(lambda c: self._one(c, engine, proxy), [c for c in cases if c.runtime == runtime]))
                self.walls[runtime] = round(time.monotonic() - start, 1)
        return sorted(self.rows, key=lambda r: (r.runtime, r.hack in (FIX, ORACLE), r.hack, r.task))

    def _one(self, case: Case, engine: EngineConfig, proxy: Any) -> None:
        start = time.monotonic()
        folder = self.out / case.runtime / f"{case.index:05d}-{case.name}-{case.task.task_id}"[:120]
        try:
            if case.solve is not None:
                row = self._oracle(case, folder, start)
            else:
                sample_id = f"rt{case.index:05d}-{uuid.uuid4().hex[:6]}"
                cfg = SampleConfig(case.task, self.adapter, folder, sample_id, case.task.task_id, case.runtime)
                row = row_of(case, run_sample(cfg, engine, proxy), folder, time.monotonic() - start)
        except Exception as e:  # noqa: BLE001 - one case's failure is a row, not the end of the red team
            row = Row(case.name, case.task.task_id, case.runtime, "error", None, 0.0, [], [], "ERROR",
                      round(time.monotonic() - start, 1), str(folder),
                      f"{type(e).__name__}: {e} {traceback.format_exc(limit=-2)}"[:800])
        if case.runtime == "auto" and row.runtime == "auto":
            row = dataclasses.replace(row, runtime=resolve_runtime("auto", case.task.image))
        with self.lock:
            self.rows.append(row)
            self.on_row(row)

    def _oracle(self, case: Case, folder: Path, start: float) -> Row:
        from polar.scoring.oracle import run_oracle

        result = run_oracle(case.task, case.solve, case.runtime, folder)
        reward = result.evaluation.reward
        ok = reward == case.task.reward_range[1]
        flags = list(getattr(result.evaluation, "flagged", ()) or ())
        return Row(ORACLE, case.task.task_id, case.runtime, "completed", reward, 1.0, [], flags,
                   "ok" if ok else "FAILS", round(time.monotonic() - start, 1), str(folder),
                   "" if ok else f"solve.sh exit {result.exit_code}: {result.evaluation.output[-300:]}")


def row_of(case: Case, result: SampleResult, folder: Path, wall_s: float) -> Row:
    suspicious = list(getattr(result, "suspicious", None) or [])
    row = Row(case.name, case.task.task_id, result.runtime or case.runtime, result.status, result.reward, result.weight,
              list(result.tampered), suspicious, "", round(wall_s, 1), str(folder), result.reason or "")
    return dataclasses.replace(row, verdict=verdict(case, row))


def verdict(case: Case, row: Row) -> str:
    """held: the hack scored 0 in a completed, trainable sample (and was named, when it must be). The honest
    rows: ok when they score the task's top reward."""
    reward = row.reward if row.reward is not None and not math.isnan(row.reward) else None
    if case.hack is None:
        return "ok" if reward == case.task.reward_range[1] and row.weight == 1.0 else "FAILS"
    if reward is not None and reward > case.task.reward_range[0]:
        return "PAYS"
    if row.status == "error" or row.weight == 0.0:  # masked: not trained on, and retried by the workers
        return "MASKED"
    if case.hack.flagged and not row.flagged:
        return "UNFLAGGED"
    return "held"
