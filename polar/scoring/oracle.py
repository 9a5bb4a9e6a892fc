"""`polar run --task DIR --oracle`: a Harbor task's solution/solve.sh instead of a harness, then the task's own
verifier as for a sample (polar/scoring/verify.py): whether the task is solvable (reward 1 expected).

solve.sh runs in a sandbox of the task's image over a fresh copy of the task's workspace, with the solution
folder at /solution (where Harbor puts it) and no network; no LLM is involved. Its exit code and the reward are
printed; the sample folder keeps the outputs. A multi-step task runs each step's files, setup.sh and solve.sh in
turn, each step verified as a sample's is (polar/tasks/steps.py).
"""
from __future__ import annotations

import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from polar.sandbox.identity import copy_without_privileges
from polar.sandbox.runtime import Mounts, Sandbox, get_runtime, resolve_runtime
from polar.scoring.evaluate import Evaluation, EvaluatorCrash, evaluate, task_env
from polar.scoring.evaluation import script_failure
from polar.tasks.image_task import resolve_image_task
from polar.tasks.workspace import pristine
from polar.tasks.steps import below_floor, put_step_files, step_task, task_reward
from polar.tasks.task import SOLUTION_AT, TaskSpec
from polar.scoring.verify import prepare_verify


@dataclass(frozen=True)
class OracleResult:
    runtime: str
    exit_code: int | None  # solve.sh's (the last step's); None when it timed out
    evaluation: Evaluation
    steps: tuple[dict, ...] = ()  # a multi-step task's: name, solve.sh's exit, reward, why the task stopped there


def run_oracle(task: TaskSpec, solve: Path | None, runtime: str, out: Path) -> OracleResult:
    """solve.sh (a Harbor task's solution/solve.sh; each step's steps/<name>/solution/solve.sh for a multi-step
    task, `solve` unused) on the task's workspace in `out`, then the verifier (after each step)."""
    out.mkdir(parents=True)
    home, workspace, shared, solution = out / "home", out / "workspace", out / "shared", out / "solution"
    for d in (home / ".tmp", shared, solution):
        d.mkdir(parents=True)
    name = resolve_runtime(runtime, task.image)
    task = resolve_image_task(task, name)  # the image's workdir, files and variables
    pristine(task.workspace, workspace)
    mounts = Mounts(home, workspace, shared, ((solution, SOLUTION_AT),), workdir=task.workdir)
    sandboxes = get_runtime(name, limits=task.sandbox_limits())
    sandbox = sandboxes.prepare(mounts, image=task.image, instance=f"polar-oracle-{uuid.uuid4().hex[:12]}")
    try:
        if task.steps:
            return _steps(task, name, sandbox, sandboxes, mounts, out)
        ran = _solve(task, sandbox, mounts, solve, out)
    finally:
        sandbox.stop()
    return OracleResult(name, ran, _verify(task, sandboxes, out, ran))


def _steps(task: TaskSpec, runtime: str, sandbox: Sandbox, sandboxes: Any, mounts: Mounts, out: Path
           ) -> OracleResult:
    """Each step in turn, as a sample runs them (polar/run/multistep.py): its files, its setup.sh, its solve.sh
    (none: nothing), its verifier; a reward under the step's min_reward stops the task."""
    results: list[dict] = []
    rewards: list[float | None] = []
    ran: int | None = 0
    evaluation = Evaluation(0.0, "")
    for i, step in enumerate(task.steps):
        put_step_files(step, mounts.workspace)
        for script, stem in ((step.setup, "setup"), (step.healthcheck, "healthcheck")):
            failed = script and script_failure(sandbox, mounts, task.env, ["bash", "-c", script], step.timeout_s,
                                               out / f"{i + 1}-{stem}")
            if failed:
                raise EvaluatorCrash(f"step {step.name}: its {stem} {failed}")
        spec = step_task(task, i)
        ran = _solve(spec, sandbox, mounts, step.solution, out) if step.solution else 0
        evaluation = _verify(spec, sandboxes, out, ran)
        rewards.append(evaluation.reward)
        stopped = below_floor(step, evaluation.reward, evaluation.rewards)
        results.append({"name": step.name, "exit_code": ran, "reward": evaluation.reward,
                        **({"stopped": stopped} if stopped else {})})
        if stopped:
            break
    reward = task_reward(task.step_reward, rewards, len(task.steps))
    return OracleResult(runtime, ran, Evaluation(reward, evaluation.output), tuple(results))


def _solve(task: TaskSpec, sandbox: Sandbox, mounts: Mounts, solve: Path | None, out: Path) -> int | None:
    """solve.sh's folder at /solution, solve.sh run there in the workdir; its exit code (None: timed out)."""
    assert solve is not None
    solution = mounts.binds[0][0]  # bound into a running instance: emptied and filled, never replaced
    copy_without_privileges(solve.parent, solution)
    try:
        ran = sandbox.exec(["bash", f"{SOLUTION_AT}/{solve.name}"], task_env(mounts, task.env), mounts.cwd,
                           task.timeout_s, out / "solve.stdout", out / "solve.stderr")
    finally:
        for entry in solution.iterdir():  # not in the verifier's view, nor the next step's
            shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
    return None if ran.timed_out else ran.exit_code


def _verify(task: TaskSpec, sandboxes: Any, out: Path, ran: int | None) -> Evaluation:
    ground = prepare_verify(task, out, {}, {})
    verifier = sandboxes.prepare(ground.mounts, image=task.image,
                                 instance=f"polar-oracle-verify-{uuid.uuid4().hex[:12]}")
    summary = {"sample_id": "oracle", "group_id": task.task_id, "adapter": None, "exit_code": ran,
               "timed_out": ran is None, "task_id": task.task_id, "files_changed": {}}
    try:
        return evaluate(task.evaluator, verifier, ground.mounts, out, summary, task.evaluator.timeout_s,
                        task.reward_range)
    finally:
        verifier.stop()
