"""`polar run --task DIR --oracle`: a Harbor task's solution/solve.sh instead of a harness, then the task's own
verifier as for a sample (polar/tasks/verify.py): whether the task is solvable (reward 1 expected).

solve.sh runs in a sandbox of the task's image over a fresh copy of the task's workspace, with the solution
folder at /solution (where Harbor puts it) and no network; no LLM is involved. Its exit code and the reward are
printed; the sample folder keeps the outputs.
"""
from __future__ import annotations

import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path

from polar.sandbox.identity import copy_without_privileges
from polar.sandbox.runtime import Mounts, get_runtime, resolve_runtime
from polar.tasks.evaluate import Evaluation, evaluate, task_env
from polar.tasks.image_task import resolve_image_task
from polar.tasks.precheck import pristine
from polar.tasks.task import SOLUTION_AT, TaskSpec
from polar.tasks.verify import prepare_verify


@dataclass(frozen=True)
class OracleResult:
    runtime: str
    exit_code: int | None  # solve.sh's; None when it timed out
    evaluation: Evaluation


def run_oracle(task: TaskSpec, solve: Path, runtime: str, out: Path) -> OracleResult:
    """solve.sh (a Harbor task's solution/solve.sh) on the task's workspace in `out`, then the verifier."""
    out.mkdir(parents=True)
    home, workspace, shared, solution = out / "home", out / "workspace", out / "shared", out / "solution"
    for d in (home / ".tmp", shared):
        d.mkdir(parents=True)
    name = resolve_runtime(runtime, task.image)
    task = resolve_image_task(task, name)  # the image's workdir, files and variables
    pristine(task.workspace, workspace)
    copy_without_privileges(solve.parent, solution)
    mounts = Mounts(home, workspace, shared, ((solution, SOLUTION_AT),), workdir=task.workdir)
    sandboxes = get_runtime(name, limits=task.sandbox_limits())
    sandbox = sandboxes.prepare(mounts, image=task.image, instance=f"polar-oracle-{uuid.uuid4().hex[:12]}")
    try:
        ran = sandbox.exec(["bash", f"{SOLUTION_AT}/{solve.name}"], task_env(mounts, task.env), mounts.cwd,
                           task.timeout_s, out / "solve.stdout", out / "solve.stderr")
    finally:
        sandbox.stop()
    shutil.rmtree(solution)  # not in the verifier's view either
    ground = prepare_verify(task, out, {}, {})
    verifier = sandboxes.prepare(ground.mounts, image=task.image,
                                instance=f"polar-oracle-verify-{uuid.uuid4().hex[:12]}")
    summary = {"sample_id": "oracle", "group_id": task.task_id, "adapter": None, "exit_code": ran.exit_code,
               "timed_out": ran.timed_out, "task_id": task.task_id, "files_changed": {}}
    try:
        evaluation = evaluate(task.evaluator, verifier, ground.mounts, out, summary, task.evaluator.timeout_s,
                              task.reward_range)
    finally:
        verifier.stop()
    return OracleResult(name, None if ran.timed_out else ran.exit_code, evaluation)
