"""What every evaluator shares: its result (`Evaluation`), the failure that is not the agent's
(`EvaluatorCrash`), the task's environment in the verify sandbox, the rule for a verifier's timeout, and how
much of its output is kept; and how a task's own shell line (a healthcheck, a step's setup.sh) fails in a sandbox
(`script_failure`)."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Mapping

from polar.sandbox import occupancy
from polar.sandbox.runtime import Mounts, Sandbox
from polar.tasks.task import EvaluatorSpec

OUTPUT_LIMIT = 20000  # characters of evaluator output kept
SANDBOX_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# A verifier timeout while this node runs more sample stages per core than this (its own count, occupancy.py) is
# the machine's fault (the sample is masked and retried), otherwise the workspace's (an endless loop in the
# agent's code: reward 0). This project's own test suite runs several samples at once on 2 cores.
OVERLOAD_PER_CORE = 4.0


class EvaluatorCrash(RuntimeError):
    def __init__(self, message: str, output: str = "") -> None:
        super().__init__(message)
        self.output = output


@dataclass(frozen=True)
class Evaluation:
    reward: float
    output: str  # what the evaluator printed (stdout then stderr), or a description of the check
    exit_code: int | None = None
    unscored: str | None = None  # why the reward is a default 0: the verifier gave none (polar/scoring/precheck.py)
    rewards: dict[str, float] | None = None  # a Harbor reward.json: the main reward and its named extras
    flagged: tuple[str, ...] = ()  # the observer's: why the run looks forged (reward 0; the sample's `suspicious`)


def task_env(mounts: Mounts, extra: Mapping[str, str] = MappingProxyType({})) -> dict[str, str]:
    """The task's environment, not the agent's: a fresh HOME, and no user site or script-folder path for python;
    with the task's own variables (`extra`: its image's, its [environment] and [verifier] env), except for the
    ones that keep the verifier apart from the agent's files."""
    own = {"HOME": str(mounts.home), "TMPDIR": str(mounts.home / ".tmp"), "PYTHONDONTWRITEBYTECODE": "1",
           "PYTHONNOUSERSITE": "1", "PYTHONSAFEPATH": "1"}
    return {"PATH": SANDBOX_PATH, "LANG": "C.UTF-8", **extra, **own}


def verifier_timeout(spec: EvaluatorSpec, timeout_s: float, output: str) -> Evaluation:
    """A verifier's timeout: the machine's (EvaluatorCrash) when this node ran more sample stages than its cores
    allow, else the workspace's reward 0."""
    busy, cores = occupancy.running(), occupancy.slots()
    if busy > OVERLOAD_PER_CORE * cores:
        raise EvaluatorCrash(f"timed out after {timeout_s:g}s on an overloaded node ({busy} sample stages "
                             f"running on {cores} cores): {spec.command or spec.python or spec.kind}", output)
    return Evaluation(0.0, output + f"\n[polar] the task's verifier timed out after {timeout_s:g}s ({busy} "
                      f"sample stages running on {cores} cores): reward 0", None)


def script_failure(sandbox: Sandbox, mounts: Mounts, env: Mapping[str, str], argv: list[str], timeout_s: float,
                   stem: Path) -> str | None:
    """Run a task's own shell line (argv) in `sandbox`, in the workdir, its output in `stem`.stdout/.stderr: None
    when it exits 0, else how it failed ("exited N: " or "timed out after Ss: ", then its stderr's tail)."""
    err = stem.with_name(f"{stem.name}.stderr")
    ran = sandbox.exec(argv, task_env(mounts, env), mounts.cwd, timeout_s, stem.with_name(f"{stem.name}.stdout"), err)
    if not ran.timed_out and ran.exit_code == 0:
        return None
    how = f"timed out after {timeout_s:g}s" if ran.timed_out else f"exited {ran.exit_code}"
    return f"{how}: {' '.join(read_tail(err).split())[-300:]}"


def read_tail(path: Path) -> str:
    """The tail of an output file: the workspace's code may have printed gigabytes."""
    if not path.exists():
        return ""
    with path.open("rb") as f:
        f.seek(max(0, f.seek(0, os.SEEK_END) - 4 * OUTPUT_LIMIT))  # UTF-8: at most 4 bytes a character
        return f.read().decode(errors="replace")
