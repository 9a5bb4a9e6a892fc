"""Evaluators: turn a finished sample into a reward (spec: polar/tasks/load.py EvaluatorSpec, docs/tasks.md).

They run on the verify ground (polar/scoring/verify.py): a fresh sandbox over a copy of the final workspace with
the task's tests staged and a fresh HOME, never where the agent ran.
  command  a shell line run in that sandbox, in the workspace copy, with its own timeout: reward 1.0 for exit 0
           else 0.0, or the float on the last line of stdout (`reward: stdout`) or in the workspace file
           `reward_file` (`reward: file`, read on the host without following links)
  files    expected paths (relative to the workspace) and contents (null: must exist): 1.0 when all match
  python   `module:function(workspace: Path, summary: dict)` -> float or {"reward": float, "output": str},
           run INSIDE that sandbox by Polar's runner (polar/scoring/observe_child.py) with the image's python3,
           the module and the .py files beside it copied in, the workspace off sys.path; never in a host process
  pytest   the task's own test files under Polar's runner and plugin; the reward from per-test outcomes it
           reports over a socket, judged against the ids taken from the files here (polar/scoring/observer.py)
  harbor   a Harbor task's `bash /tests/test.sh` in that sandbox; the reward from /logs/verifier/reward.txt or
           reward.json (polar/tasks/harbor.py), none = 0

Who failed decides: what the workspace caused (the task's command failing in any way, exit 126/127 included,
a missing, linked or malformed reward, a reward outside the task's `reward_range` or not finite, a timeout while
this node ran no more samples than it has room for, a python verifier raising or dying) is reward 0 for a
sample that completed. EvaluatorCrash is kept for what the host can prove is not the agent's: a python verifier
that cannot be imported or returns no number, Polar's runner never starting, a timeout while this node ran
more samples than OVERLOAD_PER_CORE per core (its own accounting, polar/sandbox/occupancy.py: not the load
average, which the agent's code can raise). The sample is then an infrastructure error.
"""
from __future__ import annotations

import math
import os
import re
import shutil
import stat
from pathlib import Path
from typing import Any

from polar.sandbox.runtime import ExecResult, Mounts, Sandbox
from polar.sandbox.agent_files import AgentFileError, AgentFileMissing, read_beneath
from polar.scoring.evaluation import (OUTPUT_LIMIT, Evaluation, EvaluatorCrash, read_tail, task_env,
                                   verifier_timeout)
from polar.tasks.task import DEFAULT_REWARD_RANGE, EvaluatorSpec

__all__ = ["Evaluation", "EvaluatorCrash", "evaluate", "task_env"]  # evaluation.py's names, importable here as before


def evaluate(spec: EvaluatorSpec, sandbox: Sandbox, mounts: Mounts, out: Path, summary: dict[str, Any],
             timeout_s: float, reward_range: tuple[float, float] = DEFAULT_REWARD_RANGE) -> Evaluation:
    """The reward of the verify ground `mounts`; EvaluatorCrash for a failure that is not the agent's."""
    if spec.kind == "command":
        result = _command(spec, sandbox, mounts, out, timeout_s)
    elif spec.kind == "harbor":
        result = _harbor(spec, sandbox, mounts, out, timeout_s)
    elif spec.kind == "files":
        result = _files(spec, mounts.workspace)
    else:
        from polar.scoring.observed import run_pytest, run_python  # lazy: the observer's socket machinery

        run = run_pytest if spec.kind == "pytest" else run_python
        result = run(spec, sandbox, mounts, out, summary, timeout_s)
    low, high = reward_range
    if not (math.isfinite(result.reward) and low <= result.reward <= high):
        # written where the workspace's code could write it (a file, stdout, what a verifier it fed returned):
        # the host cannot prove it is the verifier's own, so reward 0; precheck still catches a verifier
        # that gives it on the untouched workspace
        why = f"reward {result.reward!r} is outside the task's reward_range [{low:g}, {high:g}]"
        return Evaluation(0.0, result.output + f"\n[polar] {why}: reward 0", result.exit_code, why,
                          flagged=result.flagged)
    return result


def _run_command(argv: list[str], spec: EvaluatorSpec, sandbox: Sandbox, mounts: Mounts, out: Path,
                 timeout_s: float) -> tuple[ExecResult, str, str, Evaluation | None]:
    """(result, stdout, stdout + stderr, the timeout's reward 0 or None) of the task's command."""
    stdout, stderr = out / "evaluator.stdout", out / "evaluator.stderr"
    result = sandbox.exec(argv, task_env(mounts, spec.env), mounts.cwd, timeout_s, stdout, stderr)
    text = read_tail(stdout)
    output = (text + read_tail(stderr))[-OUTPUT_LIMIT:]
    if not result.timed_out:
        return result, text, output, None
    return result, text, output, verifier_timeout(spec, timeout_s, output)


def _command(spec: EvaluatorSpec, sandbox: Sandbox, mounts: Mounts, out: Path, timeout_s: float) -> Evaluation:
    result, text, output, timed_out = _run_command(["sh", "-c", spec.command or "false"], spec, sandbox, mounts,
                                                   out, timeout_s)
    if timed_out:
        return timed_out
    if spec.reward == "exit":
        return Evaluation(1.0 if result.exit_code == 0 else 0.0, output, result.exit_code)
    if result.exit_code in (126, 127):  # the workspace broke the scorer (e.g. os._exit(127) on import)
        why = f"the task's command exited {result.exit_code}"
        return Evaluation(0.0, output + f"\n[polar] {why}: reward 0", result.exit_code, why)
    if spec.reward == "stdout":
        lines = [line for line in text.splitlines() if line.strip()]
        return _parsed(lines[-1] if lines else "", "the last line of stdout", output, result.exit_code)
    try:
        text = read_beneath(mounts.workspace, spec.reward_file).decode(errors="replace")
    except AgentFileError as e:
        # `tests && echo 1 > reward.txt` writes no file when the tests fail: that is the verifier's own 0
        own_zero = isinstance(e, AgentFileMissing) and result.exit_code not in (0, None)
        return Evaluation(0.0, output + f"\n[polar] {e}: reward 0", result.exit_code, None if own_zero else str(e))
    return _parsed(text.strip(), spec.reward_file, output, result.exit_code)


def _harbor(spec: EvaluatorSpec, sandbox: Sandbox, mounts: Mounts, out: Path, timeout_s: float) -> Evaluation:
    """A Harbor task's tests/test.sh at the read-only /tests; its reward from /logs/verifier (polar/tasks/harbor.py),
    which Polar made empty. First, as the fresh sandbox's first process, Polar's observer runs the task's pytest
    files (polar/scoring/harbor_observe.py): test.sh's reward is capped at the share of tests it saw pass. No
    reward file is 0 (`pytest && echo 1 > reward.txt`: the tests failed); a malformed, linked, doubled or
    out-of-range one is the workspace's 0, flagged; no reward at all on the untouched workspace (precheck)."""
    from polar.tasks.harbor import TEST_COMMAND, read_reward
    from polar.scoring.harbor_observe import observe
    from polar.tasks.task import LOGS_AT

    logs = next(src for src, dst in mounts.binds if dst == LOGS_AT)
    seen = observe(sandbox, mounts, out, timeout_s, spec.env)
    early = _clear_logs(logs)  # only the agent's code ran since Polar made it: anything there is its doing
    result, _text, output, timed_out = _run_command(list(TEST_COMMAND), spec, sandbox, mounts, out, timeout_s)
    output = "\n".join([*seen.lines, output])[-OUTPUT_LIMIT:]
    if timed_out:
        return timed_out
    flags = [*seen.flags, *early]
    reward, rewards, problem = read_reward(logs)
    if problem is not None:
        return Evaluation(0.0, output + f"\n[polar] {problem}: reward 0", result.exit_code, problem,
                          flagged=(*flags, f"harbor: {problem}"))
    if seen.observed and seen.share == 1.0 and not flags and (reward or 0.0) < 1.0:  # the tests pass, test.sh not
        wrote = "no reward" if reward is None else f"{reward:g}"
        output += (f"\n[polar] Polar's observer saw every test pass, but test.sh wrote {wrote}; test.sh's last "
                   f"error: {_last_error(output)}")
    if reward is None:
        return Evaluation(0.0, output + f"\n[polar] test.sh exited {result.exit_code} and wrote no "
                                        "/logs/verifier/reward.txt or reward.json: reward 0", result.exit_code,
                          flagged=tuple(flags))
    if flags:
        return Evaluation(0.0, output + "\n[polar] flagged: reward 0", result.exit_code, flagged=tuple(flags))
    if reward > seen.share:
        flags.append(f"harbor: test.sh's reward {reward:g} is more than the {seen.share:.0%} of the task's tests "
                     "Polar's observer saw pass")
        return Evaluation(seen.share, output + f"\n[polar] {flags[-1]}: reward {seen.share:g}", result.exit_code,
                          flagged=tuple(flags))
    return Evaluation(reward, output, result.exit_code, rewards=rewards)


ERROR_LINE = re.compile(r"error|not found|denied|fatal|no such|cannot|failed|unable", re.I)


def _last_error(output: str) -> str:
    """test.sh's last line that reads like an error (its last line when none does), for the one-line cause."""
    lines = [line.strip() for line in output.splitlines() if line.strip() and not line.startswith("[polar]")]
    found = [line for line in lines if ERROR_LINE.search(line)]
    return ((found or lines or ["(no output)"])[-1])[:300]


def _clear_logs(logs: Path) -> list[str]:
    """Empty /logs/verifier again before test.sh starts, never following a link the agent's code made (it may
    have replaced the folder itself by a link to a host path); a flag for each thing it held."""
    verifier = logs / "verifier"
    try:
        fd = os.open(verifier, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:  # a link, a file, gone: put a fresh folder there
        if verifier.is_symlink() or verifier.is_file():
            verifier.unlink()
        elif verifier.is_dir():
            shutil.rmtree(verifier, ignore_errors=True)
        verifier.mkdir(exist_ok=True)
        return ["harbor: /logs/verifier replaced while Polar's observer ran the tests"]
    try:
        names = sorted(os.listdir(fd))
        for name in names:
            if stat.S_ISDIR(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode):
                shutil.rmtree(name, dir_fd=fd)  # resists links inside, from 3.11
            else:
                os.unlink(name, dir_fd=fd)
    finally:
        os.close(fd)
    from polar.scoring.allow import shown  # a name that is not UTF-8, escaped

    return [f"harbor: /logs/verifier/{shown(n)} written while Polar's observer ran the tests" for n in names]


def _parsed(text: str, where: str, output: str, exit_code: int | None) -> Evaluation:
    """A reward as printed: no number at all is the workspace's failure (0); a number out of bounds is checked
    against the task's reward_range by evaluate()."""
    try:
        return Evaluation(float(text), output, exit_code)
    except ValueError:
        why = f"{where} is not a number ({text[:100]!r})"
        return Evaluation(0.0, output + f"\n[polar] {why}: reward 0", exit_code, why)


def _files(spec: EvaluatorSpec, workspace: Path) -> Evaluation:
    lines, ok = [], True
    for rel, expected in spec.files.items():
        try:
            data = read_beneath(workspace, rel)
        except AgentFileError as e:
            ok = False
            lines.append(f"missing: {rel}" if isinstance(e, AgentFileMissing) else f"unreadable: {e}")
            continue
        if expected is not None and data.decode(errors="replace") != expected:
            ok = False
            lines.append(f"differs: {rel}")
        else:
            lines.append(f"ok: {rel}")
    return Evaluation(1.0 if ok else 0.0, "\n".join(lines))


