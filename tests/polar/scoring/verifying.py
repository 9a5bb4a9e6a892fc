"""A sample's verify stage as polar/run/sample.py runs it, without a harness: the agent's work done here on a copy
of the task's workspace, then the ground (polar/scoring/verify.py) and the task's verifier in a fresh bwrap
sandbox. Shared by the scoring tests that try honest work and hacks at the verifier."""
from __future__ import annotations

import dataclasses
import uuid
from pathlib import Path
from typing import Callable

from polar.run.summary import snapshot
from polar.sandbox.runtime import get_runtime
from polar.scoring.evaluate import Evaluation, evaluate
from polar.scoring.oracle import oracle_allowlist
from polar.scoring.verify import VerifyGround, prepare_verify
from polar.tasks.task import TaskSpec
from polar.tasks.workspace import pristine


def verify_sample(task: TaskSpec, tmp_path: Path, work: Callable[[Path], None]) -> tuple[Evaluation, VerifyGround]:
    """`work` on the task's workspace, the allowlist its oracle teaches when it has no `submit` (as a sample's
    verify stage takes it), the ground and the verifier's evaluation."""
    out = tmp_path / f"sample-{uuid.uuid4().hex[:6]}"
    (out / "home").mkdir(parents=True)
    pristine(task.workspace, out / "workspace")
    before = snapshot(out / "workspace")
    work(out / "workspace")
    if (taught := oracle_allowlist(task, "bwrap", out / "oracle")) is not None:
        task = dataclasses.replace(task, submit=taught)
    ground = prepare_verify(task, out, before, snapshot(out / "workspace"))
    sandbox = get_runtime("bwrap").prepare(ground.mounts, image="host", instance=f"v-{uuid.uuid4().hex[:8]}")
    try:
        summary = {"sample_id": "s", "group_id": "g", "adapter": None, "exit_code": 0, "timed_out": False,
                   "task_id": task.task_id, "files_changed": {}}
        return evaluate(task.evaluator, sandbox, ground.mounts, out, summary, 60, task.reward_range), ground
    finally:
        sandbox.stop()
