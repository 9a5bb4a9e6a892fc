"""Multi-step Harbor tasks (docs/tasks.md "Multi-step tasks"): what each step sees, and how the steps' rewards make
the sample's.

A step is run as a task of its own on the workspace the steps before it left (polar/run/sample.py): `step_task`
is the task as step `i` sees it. Its pristine workspace, the ground its verifier stands on, is the task's own
files and the files the steps so far shipped (steps/<name>/workdir/), never what the agent made in an earlier
step: the agent's work comes in only through the allowlist, at every step (polar/scoring/allow.py). Its tests are
the task's tests/ with the step's tests/ over them. Both are built once per content in a cache
(POLAR_STEP_CACHE, default ~/.cache/polar/steps/), so every sample of a node shares them and the verifier
pre-check (polar/scoring/precheck.py) runs once per step, not per sample.

The sample's reward is the steps' mean (a step that did not run counts 0) or the final step's (0 when the task
stopped before it): Harbor's multi_step_reward_strategy. A step whose reward is below its `min_reward` stops the
task there.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import uuid
from pathlib import Path
from types import MappingProxyType
from typing import Mapping

from polar.sandbox.identity import copy_without_privileges
from polar.sandbox.agent_files import put_beneath
from polar.tasks.workspace import listing, pristine
from polar.tasks.task import SETUP_SCRIPT, StepSpec, TaskSpec

CACHE_ENV = "POLAR_STEP_CACHE"
DEFAULT_CACHE = "~/.cache/polar/steps"


def cache_root() -> Path:
    return Path(os.environ.get(CACHE_ENV) or DEFAULT_CACHE).expanduser()


def step_task(task: TaskSpec, index: int) -> TaskSpec:
    """The task as its step `index` sees it: the step's instruction and budgets, the verifier's variables with the
    step's over them, the pristine workspace through this step, the task's tests with the step's over them."""
    step = task.steps[index]
    shipped = [s.files for s in task.steps[:index + 1] if s.files]
    return dataclasses.replace(
        task, instruction=step.instruction, timeout_s=step.timeout_s,
        workspace=_layered(task.workspace, shipped, skip=SETUP_SCRIPT) if shipped else task.workspace,
        tests=_layered(task.tests, [step.tests]) if step.tests else task.tests,
        evaluator=dataclasses.replace(task.evaluator, timeout_s=step.verify_timeout_s,
                                      env=MappingProxyType({**task.evaluator.env, **step.verifier_env})),
        healthcheck=step.healthcheck, healthcheck_timeout_s=step.healthcheck_timeout_s, steps=())


def put_step_files(step: StepSpec, workspace: Path) -> list[str]:
    """Copy the step's workdir files (not setup.sh) into the agent's live workspace, where its processes may still
    run: each by descriptor, replacing whatever the agent left at that path, never through its links. Returns the
    paths put."""
    if step.files is None:
        return []
    put = []
    for dirpath, dirs, files in os.walk(step.files):  # the task's own folder: links are files here, not followed
        rel_dir = os.path.relpath(dirpath, step.files)
        for name in sorted(files + [d for d in dirs if os.path.islink(os.path.join(dirpath, d))]):
            rel = name if rel_dir == "." else f"{rel_dir}/{name}"
            if rel != SETUP_SCRIPT:
                put_beneath(workspace, rel, Path(dirpath) / name)
                put.append(rel)
    return put


def step_session_id(sample_id: str, index: int) -> str:
    """The session of a sample's step `index`: `<sample>.s<n>`, shortened by a digest where that is too long."""
    suffix = f".s{index + 1}"
    if len(sample_id) + len(suffix) <= 128:
        return sample_id + suffix
    return f"{sample_id[:100]}-{hashlib.sha256(sample_id.encode()).hexdigest()[:12]}{suffix}"


def below_floor(step: StepSpec, reward: float | None, rewards: Mapping[str, float] | None) -> str | None:
    """Why the task stops after this step (its reward under `min_reward`), or None. A named floor whose reward
    the verifier did not write counts that reward 0."""
    floor = step.min_reward
    if floor is None:
        return None
    if not isinstance(floor, Mapping):
        got = reward or 0.0
        return f"step {step.name}: reward {got:g} is below its min_reward {floor:g}" if got < floor else None
    named = {**({"reward": reward} if reward is not None else {}), **(rewards or {})}
    low = [f"{k} {named.get(k, 0.0):g} < {v:g}" for k, v in floor.items() if named.get(k, 0.0) < v]
    return f"step {step.name}: below its min_reward ({', '.join(low)})" if low else None


def task_reward(strategy: str, rewards: list[float | None], steps: int) -> float:
    """The sample's reward from its steps' (in order; None: not scored), `steps` in all: mean (a step that did not
    run counts 0) or final (the last step's; 0 when the task stopped before it)."""
    if strategy == "final":
        return (rewards[-1] or 0.0) if len(rewards) == steps else 0.0
    return sum(r or 0.0 for r in rewards) / steps


def untouched_before(starts: list[dict[str, str]], ends: list[dict[str, str]], after: dict[str, str]
                     ) -> dict[str, str]:
    """A `before` snapshot for polar.scoring.verify.prepare_verify over several steps: the paths that were not the
    agent's doing. `starts[j]` is the workspace as step j's harness started, `ends[j]` as it ended. A path the host
    changed before step j's harness (its files, its setup.sh, the harness's own config) and that is alike at the
    end was not the agent's; a path the agent changed in an earlier step stays the agent's."""
    kept: dict[str, str] = {}
    for j, start in enumerate(starts):
        previous = ends[j - 1] if j else {}
        for path, digest in start.items():
            if previous.get(path) != digest and after.get(path) == digest:
                kept[path] = digest
    return kept


def _layered(base: Path | None, layers: list[Path], skip: str | None = None) -> Path:
    """`base` (a folder, a .tar.gz or none) with each layer's files copied over it in order (`skip`: a top-level
    name left out), built once per content in the step cache."""
    key = hashlib.sha256(json.dumps([listing(base), [listing(p) for p in layers], skip]).encode()).hexdigest()
    dest = cache_root() / key[:32]
    if dest.is_dir():
        return dest
    tmp = dest.with_name(f"{dest.name}.tmp-{uuid.uuid4().hex[:8]}")
    try:
        pristine(base, tmp)
        for layer in layers:
            for entry in sorted(layer.iterdir()):
                if entry.name != skip:
                    copy_without_privileges(entry, tmp / entry.name)
        try:
            tmp.rename(dest)
        except OSError:  # another process built it first
            if not dest.is_dir():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest
