"""The evaluators that run Polar's runner in the verify sandbox (polar/scoring/observe_child.py): `pytest` (per-test
outcomes judged by polar/scoring/observer.py) and `python` (a task's scoring function, never in a host process).

The runner, the channel's socket and (python) the evaluator's module go to a fresh `observer/` folder of the
verify ground's shared directory, which every runtime binds at the same path; the first process in that fresh
sandbox is the runner, so nothing of the workspace runs before it holds the channel.
"""
from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

from polar.sandbox.agent_files import AgentFileError, read_beneath
from polar.sandbox.runtime import Mounts, Sandbox
from polar.scoring import observe_child, observe_guard
from polar.scoring.evaluation import OUTPUT_LIMIT, Evaluation, EvaluatorCrash, read_tail, task_env, verifier_timeout
from polar.scoring.observer import Channel, Records, judge
from polar.tasks.expected import expected_tests
from polar.tasks.task import EvaluatorSpec

RUNNER = "polar_observe.py"
COPY_LIMIT = 32 << 20  # bytes of a python evaluator's package copied into the sandbox at most
EMPTY_INI = "pytest.ini"  # Polar's own, empty: no workspace configuration is read
OWNED = "owned.txt"  # the workspace paths of the task's own staged files, one a line (polar/scoring/verify.py)


def runner_folder(mounts: Mounts, name: str = "observer") -> Path:
    """A fresh folder of the verify ground's shared directory holding Polar's runner and its empty pytest.ini."""
    folder = mounts.shared / name
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    shutil.copyfile(observe_child.__file__, folder / RUNNER)
    shutil.copyfile(observe_guard.__file__, folder / observe_child.GUARD)
    if (mounts.shared / OWNED).is_file():  # the task's staged files (prepare_verify)
        shutil.copyfile(mounts.shared / OWNED, folder / OWNED)
    (folder / EMPTY_INI).write_text("[pytest]\n")
    return folder


def _exec(argv: list[str], spec: EvaluatorSpec, sandbox: Sandbox, mounts: Mounts, out: Path, timeout_s: float,
          channel: Channel) -> tuple[Records, str, int | None, Evaluation | None]:
    """(records, output, exit code, the timeout's verdict or None): the runner in the sandbox, the channel read."""
    # no entry point found on sys.path loads
    env = {**task_env(mounts, spec.env), "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    stdout, stderr = out / "evaluator.stdout", out / "evaluator.stderr"
    try:
        result = sandbox.exec(argv, env, mounts.cwd, timeout_s, stdout, stderr)
    finally:
        records = channel.close()
    output = (read_tail(stdout) + read_tail(stderr))[-OUTPUT_LIMIT:]
    if not records.connected:
        raise EvaluatorCrash(f"Polar's runner did not start in the verify sandbox (exit {result.exit_code})",
                             output)
    late = verifier_timeout(spec, timeout_s, output) if result.timed_out else None
    return records, output, None if result.timed_out else result.exit_code, late


def run_pytest(spec: EvaluatorSpec, sandbox: Sandbox, mounts: Mounts, out: Path, summary: dict[str, Any],
               timeout_s: float) -> Evaluation:
    """The task's test files (staged in the workspace by prepare_verify) under Polar's runner; the reward from the
    per-test records, judged against the ids read here from the same files before the runner starts."""
    expected: list[str] = []
    for rel in spec.pytest:  # a file's tests, or one test by its id (an SWE instance's, polar/tasks/swe.py)
        expected += [rel.partition("[")[0]] if "::" in rel else expected_tests(mounts.workspace, rel)
    folder = runner_folder(mounts)
    ini = mounts.workspace / "pytest.ini"  # the task's own (never taken from the agent: polar/scoring/allow.py)
    try:
        read_beneath(mounts.workspace, "pytest.ini")
    except AgentFileError:
        ini = folder / EMPTY_INI
    channel = Channel(folder)
    argv = ["python3", "-I", str(folder / RUNNER), "pytest", str(channel.path), str(ini), "--", *spec.pytest]
    records, output, code, late = _exec(argv, spec, sandbox, mounts, out, timeout_s, channel)
    if records.of("no-pytest"):
        raise EvaluatorCrash(f"pytest cannot be imported in the task's image: {records.of('no-pytest')[0][0]}",
                             output)
    if late is not None:
        return late
    verdict = judge(expected, records)
    return Evaluation(verdict.reward, output + "\n" + "\n".join(verdict.lines), code, flagged=verdict.flags)


def run_python(spec: EvaluatorSpec, sandbox: Sandbox, mounts: Mounts, out: Path, summary: dict[str, Any],
               timeout_s: float) -> Evaluation:
    """`module:function` of the task, in the sandbox: its module and the .py files beside it copied in."""
    folder = runner_folder(mounts)
    module = (spec.python or "").partition(":")[0]
    copy_module(module, folder / "evaluator")
    (folder / "summary.json").write_text(json.dumps(summary, indent=2))
    channel = Channel(folder)
    argv = ["python3", "-I", str(folder / RUNNER), "python", str(channel.path), str(folder / "evaluator"),
            spec.python or "", str(folder / "summary.json")]
    records, output, code, late = _exec(argv, spec, sandbox, mounts, out, timeout_s, channel)
    if late is not None:
        return late
    return _python_verdict(spec, records, output, code)


def _python_verdict(spec: EvaluatorSpec, records: Records, output: str, code: int | None) -> Evaluation:
    for kind, what in (("import-error", "cannot be imported"), ("no-number", "expected a finite number")):
        if records.of(kind):
            raise EvaluatorCrash(f"{spec.python} {what}: {records.of(kind)[0][0][:300]}", output)
    if not records.of("imported"):
        raise EvaluatorCrash(f"{spec.python} failed before it was imported (exit {code})", output)
    if guarded := [f"introspection stopped: {f[0]}" for f in records.of("guard") if f]:  # observe_guard.py
        why = f"{spec.python}: the code under test reached for Polar's runner"
        return Evaluation(0.0, output + f"\n[polar] {why}: reward 0", code, why, flagged=tuple(guarded[:5]))
    if records.of("raised"):  # it raised on the agent's files: the workspace's failure
        why = f"{spec.python} raised on the workspace"
        return Evaluation(0.0, output + records.of("raised")[0][0] + f"\n[polar] {why}: reward 0", code, why)
    results = records.of("result")
    if len(results) != 1 or records.bad:
        why = f"{spec.python} ended without one result from Polar's runner (exit {code})"
        return Evaluation(0.0, output + f"\n[polar] {why}: reward 0", code, why,
                          flagged=(why, *records.bad[:5]))
    reward, said = results[0]
    return Evaluation(float(reward), said + output, code)


def copy_module(module: str, dest: Path) -> Path:
    """The evaluator's module found on this host's path (the current folder first) without importing it, copied
    under dest with the rest of its top-level package's .py files (what it may import of its own project)."""
    parts = module.split(".")
    for root in [Path.cwd(), *map(Path, filter(None, sys.path))]:
        base = root.joinpath(*parts)
        found = base.with_suffix(".py") if base.with_suffix(".py").is_file() else base / "__init__.py"
        if found.is_file():
            break
    else:
        raise EvaluatorCrash(f"No module named {module!r} on the host's path (no {'/'.join(parts)}.py to copy into "
                             "the verify sandbox)")
    dest.mkdir(parents=True, exist_ok=True)
    if len(parts) == 1 and found.name != "__init__.py":
        shutil.copyfile(found, dest / found.name)
        return dest
    top, total = root / parts[0], 0
    for py in sorted(top.rglob("*.py")):
        rel = py.relative_to(root)
        if "__pycache__" in rel.parts or any(p.startswith(".") for p in rel.parts):
            continue
        total += py.stat().st_size
        if total > COPY_LIMIT:
            raise EvaluatorCrash(f"evaluator module {module!r}: its package {top} holds more than {COPY_LIMIT} "
                                 "bytes of .py files to copy into the verify sandbox")
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(py, dest / rel)
    return dest
