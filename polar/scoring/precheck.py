"""The verifier is checked before it is trusted: once per task, image and runtime in a process, the task's
evaluator runs on the untouched workspace, in a verify sandbox built as for a sample (polar/scoring/verify.py).

An untouched workspace usually scores 0 (the bug is not fixed yet): that is fine, a reward was produced. A
verifier that cannot produce one at all is not: its tool missing (`/usr/bin/python3: No module named pytest`),
its command not runnable (exit 126/127) or killed by a signal, no number where the reward should be, a python
verifier that cannot be imported, returns no number or raises on the task's own files. Nor is a verifier that
checks nothing: its tests ran none (pytest's `no tests ran`, exit 5; a test path that is not there, exit 4;
unittest's `Ran 0 tests`), or the task's `tests:` folder holds no file. Then every sample of the task is an
infrastructure error carrying that output and that one line (polar/run/sample.py), never a trainable 0.
"""
from __future__ import annotations

import json
import re
import shutil
import threading
import uuid
from dataclasses import dataclass
from pathlib import Path

from polar.sandbox.runtime import get_runtime
from polar.tasks.workspace import pristine
from polar.scoring.evaluate import Evaluation, EvaluatorCrash, evaluate
from polar.tasks.task import TaskSpec
from polar.scoring.verify import prepare_verify

# `python -m TOOL` without TOOL, or a script that is not there: the verifier's environment, not the workspace.
MISSING_TOOL = re.compile(r"^\S*python[\w.]*: (No module named \S+|can't open file .*)$", re.M)
# A test run that ran no test, by its exit status: it would give every sample the same reward whatever it did.
NO_TESTS = {5: re.compile(r"^[= ]*no tests ran\b.*$", re.M),
            4: re.compile(r"^ERROR: (file or directory not found|found no collectors for)\b.*$", re.M),
            None: re.compile(r"^Ran 0 tests in .*$", re.M)}


@dataclass(frozen=True)
class VerifierProblem:
    reason: str  # one line: what is wrong with the verifier
    output: str  # what it printed on the untouched workspace


# Per process: a task's verifier is checked once (a node's worker processes each check it once).
_checked: dict[str, VerifierProblem | None] = {}
_lock = threading.Lock()


def check_verifier(task: TaskSpec, runtime: str, scratch: Path) -> VerifierProblem | None:
    """None when the task's verifier produced a reward on the untouched workspace (cached); `scratch` is a folder
    this check may fill and remove. Raises what the sandbox raises (a missing image): that is not cached."""
    if task.tests is not None and not any(p.is_file() for p in task.tests.rglob("*")):
        return VerifierProblem(f"tests: {task.tests} holds no file: the task's verifier would check nothing", "")
    if task.evaluator.kind == "files":  # compared on the host: it always yields a reward
        return None
    key = json.dumps([task.task_id, str(task.workspace), str(task.tests), task.image, runtime,
                      task.evaluator.to_dict()], sort_keys=True)
    with _lock:
        if key in _checked:
            return _checked[key]
    problem = _run_check(task, runtime, scratch)
    with _lock:
        _checked[key] = problem
    return problem


def unscorable(result: Evaluation) -> str | None:
    """Why `result`, on the untouched workspace, is no reward at all; None when it is one (0 included)."""
    if result.unscored:
        return result.unscored
    if result.exit_code in (126, 127):  # `reward: exit` scores it 0: on the task's own files it is the verifier's
        return f"the task's command exited {result.exit_code} (not found or not runnable)"
    if result.exit_code is not None and result.exit_code > 128:
        return f"the task's command was killed by signal {result.exit_code - 128}"
    if (missing := MISSING_TOOL.search(result.output)) is not None:
        return f"the verifier's tool is missing in the task's image: {missing.group(0).strip()}"
    return ran_no_test(result)


def ran_no_test(result: Evaluation) -> str | None:
    """Why the untouched workspace's run ran no test at all (None when it ran some, or is no test runner)."""
    for code in (result.exit_code, None):
        if code in NO_TESTS and (found := NO_TESTS[code].search(result.output)) is not None:
            exited = f", exit {result.exit_code}" if result.exit_code is not None else ""
            return (f"the task's verifier ran no test on the untouched workspace ({found.group(0).strip('= ')}"
                    f"{exited}): it would check nothing; give the task its tests (`tests:`) and name them")
    return None


def _run_check(task: TaskSpec, runtime: str, scratch: Path) -> VerifierProblem | None:
    shutil.rmtree(scratch, ignore_errors=True)
    (scratch / "home").mkdir(parents=True)
    pristine(task.workspace, scratch / "workspace")
    ground = prepare_verify(task, scratch, {}, {})
    summary = {"sample_id": "verifier-check", "group_id": task.task_id, "adapter": None, "exit_code": None,
               "timed_out": False, "task_id": task.task_id, "files_changed": {}}
    sandbox = get_runtime(runtime, limits=task.sandbox_limits()).prepare(
        ground.mounts, image=task.image,
                                           instance=f"polar-vcheck-{task.task_id[:30]}-{uuid.uuid4().hex[:6]}")
    try:
        result = evaluate(task.evaluator, sandbox, ground.mounts, scratch, summary, task.evaluator.timeout_s,
                          task.reward_range)
    except EvaluatorCrash as e:
        return VerifierProblem(str(e), e.output)
    finally:
        sandbox.stop()
        shutil.rmtree(scratch, ignore_errors=True)
    why = unscorable(result)
    return VerifierProblem(why, result.output) if why else None
