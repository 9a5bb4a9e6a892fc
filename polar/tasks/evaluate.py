"""Evaluators: turn a finished sample into a reward (spec: polar/tasks/spec.py EvaluatorSpec, docs/tasks.md).

  command  a shell line run in the sample's own sandbox, in its workspace, after the harness exited, with its
           own timeout: reward 1.0 for exit 0 else 0.0, or the float on the last line of stdout (`reward:
           stdout`) or in the workspace file `reward_file` (`reward: file`)
  files    expected paths (relative to the workspace) and contents (null: must exist): 1.0 when all match
  python   `module:function(workspace: Path, summary: dict)` -> float or {"reward": float, "output": str},
           run on the host in a child process (`python -m polar.tasks.evaluate`) with the timeout

An evaluator that cannot give a reward (timed out, command not found, no reward where one was asked for, an
exception) raises EvaluatorCrash: the sample is then an infrastructure error, not a zero reward.
"""
from __future__ import annotations

import argparse
import importlib
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from polar.sandbox.runtime import Mounts, Sandbox, run_group
from polar.tasks.spec import EvaluatorSpec

OUTPUT_LIMIT = 20000  # characters of evaluator output kept
SANDBOX_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class EvaluatorCrash(RuntimeError):
    def __init__(self, message: str, output: str = "") -> None:
        super().__init__(message)
        self.output = output


@dataclass(frozen=True)
class Evaluation:
    reward: float
    output: str  # what the evaluator printed (stdout then stderr), or a description of the check
    exit_code: int | None = None


def evaluate(spec: EvaluatorSpec, sandbox: Sandbox, mounts: Mounts, out: Path, summary: dict[str, Any],
             timeout_s: float) -> Evaluation:
    if spec.kind == "command":
        return _command(spec, sandbox, mounts, out, timeout_s)
    if spec.kind == "files":
        return _files(spec, mounts.workspace)
    return _python(spec, mounts, out, summary, timeout_s)


def _command(spec: EvaluatorSpec, sandbox: Sandbox, mounts: Mounts, out: Path, timeout_s: float) -> Evaluation:
    stdout, stderr = out / "evaluator.stdout", out / "evaluator.stderr"
    env = {"PATH": SANDBOX_PATH, "HOME": str(mounts.home), "LANG": "C.UTF-8", "TMPDIR": str(mounts.home / ".tmp"),
           "PYTHONDONTWRITEBYTECODE": "1"}
    (mounts.home / ".tmp").mkdir(exist_ok=True)
    result = sandbox.exec(["sh", "-c", spec.command or "false"], env, mounts.workspace, timeout_s, stdout, stderr)
    text = _read(stdout)
    output = (text + _read(stderr))[-OUTPUT_LIMIT:]
    if result.timed_out:
        raise EvaluatorCrash(f"timed out after {timeout_s:g}s: {spec.command}", output)
    if result.exit_code in (126, 127):
        raise EvaluatorCrash(f"command could not run (exit {result.exit_code}): {spec.command}", output)
    if spec.reward == "exit":
        return Evaluation(1.0 if result.exit_code == 0 else 0.0, output, result.exit_code)
    if spec.reward == "stdout":
        lines = [line for line in text.splitlines() if line.strip()]
        return Evaluation(_reward(lines[-1] if lines else "", "the last line of stdout", output), output,
                          result.exit_code)
    path = mounts.workspace / spec.reward_file
    if not path.is_file():
        raise EvaluatorCrash(f"no reward file {spec.reward_file} in the workspace (exit {result.exit_code})", output)
    return Evaluation(_reward(path.read_text(errors="replace").strip(), spec.reward_file, output), output,
                      result.exit_code)


def _reward(text: str, where: str, output: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise EvaluatorCrash(f"{where} is not a number: {text[:100]!r}", output) from None
    if not math.isfinite(value):
        raise EvaluatorCrash(f"{where} is not a finite number: {text[:100]!r}", output)
    return value


def _files(spec: EvaluatorSpec, workspace: Path) -> Evaluation:
    lines, ok = [], True
    for rel, expected in spec.files.items():
        path = workspace / rel
        if not path.is_file():
            ok = False
            lines.append(f"missing: {rel}")
        elif expected is not None and path.read_text(errors="replace") != expected:
            ok = False
            lines.append(f"differs: {rel}")
        else:
            lines.append(f"ok: {rel}")
    return Evaluation(1.0 if ok else 0.0, "\n".join(lines))


def _python(spec: EvaluatorSpec, mounts: Mounts, out: Path, summary: dict[str, Any], timeout_s: float) -> Evaluation:
    summary_file, result_file = out / "evaluator.summary.json", out / "evaluator.result.json"
    summary_file.write_text(json.dumps(summary, indent=2))
    result_file.unlink(missing_ok=True)
    stdout, stderr = out / "evaluator.stdout", out / "evaluator.stderr"
    cmd = [sys.executable, "-m", "polar.tasks.evaluate", spec.python or "", str(mounts.workspace), str(summary_file),
           str(result_file)]
    import os

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")]))}
    result = run_group(cmd, env, out, timeout_s, stdout, stderr, None)
    output = (_read(stdout) + _read(stderr))[-OUTPUT_LIMIT:]
    if result.timed_out:
        raise EvaluatorCrash(f"{spec.python} timed out after {timeout_s:g}s", output)
    if result.exit_code != 0 or not result_file.is_file():
        last = output.strip().splitlines()[-1] if output.strip() else f"exit {result.exit_code}"
        raise EvaluatorCrash(f"{spec.python} failed: {last}", output)
    data = json.loads(result_file.read_text())
    return Evaluation(data["reward"], (data.get("output") or "") + output, 0)


def _read(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


def main(argv: list[str] | None = None) -> int:
    """Child process of the python evaluator: import, call, write {"reward", "output"} as JSON."""
    p = argparse.ArgumentParser(prog="python -m polar.tasks.evaluate")
    p.add_argument("target")
    p.add_argument("workspace", type=Path)
    p.add_argument("summary", type=Path)
    p.add_argument("result", type=Path)
    args = p.parse_args(argv)
    module, _, name = args.target.partition(":")
    func = getattr(importlib.import_module(module), name)
    value = func(args.workspace, json.loads(args.summary.read_text()))
    reward, output = (value.get("reward"), str(value.get("output", ""))) if isinstance(value, dict) else (value, "")
    if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(reward):
        raise SystemExit(f"{args.target} returned {value!r}: expected a finite number or {{'reward': number}}")
    args.result.write_text(json.dumps({"reward": float(reward), "output": output}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
