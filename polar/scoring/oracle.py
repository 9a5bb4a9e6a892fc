"""A task's oracle, its honest solution: a Harbor task's solution/solve.sh, an SWE instance's gold patch, or a task
file's `metadata.fix` command. It answers two questions.

- `run_oracle` (`polar run --task DIR --oracle`, `polar tasks check`): is the task solvable? The oracle runs in a
  sandbox of the task's image over a fresh copy of the task's workspace, its folder at /solution (where Harbor puts
  it), no network and no LLM; then the task's own verifier as for a sample (polar/scoring/verify.py). A multi-step
  task runs each step's files, setup.sh and solve.sh in turn, each step verified as a sample's is.
- `oracle_allowlist`: what may honest work change? A task without `submit` takes as its allowlist every regular
  file the oracle created, changed or deleted (binary files and a repository's `.git/` included), learned once
  per task content on a node (a file lock and a cache under ~/.cache/polar/oracle), so a batch pays for it once.
"""
from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import json
import os
import shutil
import stat
import tempfile
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

from polar.sandbox.egress import verifier_egress
from polar.sandbox.identity import copy_without_privileges
from polar.sandbox.runtime import Mounts, Sandbox, get_runtime, resolve_runtime
from polar.scoring.evaluate import Evaluation, EvaluatorCrash, evaluate, task_env
from polar.scoring.allow import COMPILED_SUFFIXES, entries, same_file
from polar.scoring.evaluation import script_failure
from polar.scoring.verify import VerifyGround, prepare_verify
from polar.tasks.image_task import resolve_image_task
from polar.tasks.steps import below_floor, put_step_files, step_task, task_reward
from polar.tasks.task import SOLUTION_AT, Submit, TaskError, TaskSpec
from polar.tasks.workspace import listing, pristine
from polar_traj import atomic

CACHE = Path("~/.cache/polar/oracle")  # learned allowlists, one JSON file per task content


@dataclass(frozen=True)
class OracleResult:
    runtime: str
    exit_code: int | None  # solve.sh's (the last step's); None when it timed out
    evaluation: Evaluation
    steps: tuple[dict, ...] = ()  # a multi-step task's: name, solve.sh's exit, reward, why the task stopped there
    allowlist: Submit | None = None  # what the verifier admitted of the oracle's work (learned when no `submit`)
    dropped: tuple[str, ...] = ()  # the oracle's changes the verifier did not get: a task that drops honest work
    notes: tuple[str, ...] = ()  # why, for the first of them, and the task line that would admit each

    def to_result(self, task: TaskSpec) -> dict[str, Any]:
        """result.json of the oracle's run, in a sample's words (polar/run/sample.py SampleResult's keys)."""
        ev = self.evaluation
        return {"sample_id": "oracle", "task_id": task.task_id, "group_id": task.task_id, "adapter": "oracle",
                "status": "completed", "failure": None, "reason": None, "reward": ev.reward, "weight": 1.0,
                "exit_code": self.exit_code, "evaluator_output": ev.output, "runtime": self.runtime,
                "tampered": list(self.dropped), "suspicious": list(ev.flagged), "notes": list(self.notes),
                "steps": list(self.steps)}


def oracle_script(task: TaskSpec, folder: Path) -> Path | None:
    """The task's oracle as a script whose folder goes to /solution: a Harbor task's solve.sh as shipped, an SWE
    instance's gold patch applied, a `metadata.fix` command run (both written into `folder`); None: no oracle."""
    if task.solution is not None:
        return task.solution
    if (task.metadata.get("swe") or {}).get("patch"):
        return gold_solution(task, folder)
    fix = task.metadata.get("fix")
    if isinstance(fix, str) and fix.strip():
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "solve.sh").write_text(f"#!/bin/bash\nset -e\n{fix}\n")
        return folder / "solve.sh"
    return None


def gold_solution(task: TaskSpec, folder: Path) -> Path:
    """A solve.sh that applies the instance's gold patch (`patch`) in the workspace: its `--oracle`."""
    patch = (task.metadata.get("swe") or {}).get("patch")
    if not patch:
        raise TaskError(f"instance {task.task_id}: no `patch` (the gold patch --oracle applies)")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "gold.patch").write_text(patch)
    (folder / "solve.sh").write_text("#!/bin/bash\nset -e\ngit apply --whitespace=nowarn /solution/gold.patch\n")
    return folder / "solve.sh"


def run_oracle(task: TaskSpec, solve: Path | None, runtime: str, out: Path, own: bool = True,
               verifier_hosts: Sequence[str] | None = None) -> OracleResult:
    """solve.sh (a Harbor task's solution/solve.sh; each step's steps/<name>/solution/solve.sh for a multi-step
    task, `solve` unused) on the task's workspace in `out`, then the verifier (after each step). A task without
    `submit` is verified with the allowlist this run's own changes teach; `own`: `solve` is the task's oracle, so
    what it taught is kept for the task's samples on this node (not for another script, a do-nothing one say).
    `verifier_hosts`: what the verifier of a task that asks for the internet may reach (None: offline), as a
    sample's (polar/sandbox/egress.py); solve.sh, the agent's stand-in, always runs offline."""
    name, task, mounts, sandboxes, sandbox = _start(task, runtime, out)
    try:
        stepped = _steps(task, name, sandbox, sandboxes, mounts, out) if task.steps else None
        ran = None if stepped else _solve(task, sandbox, mounts, solve, out)
    finally:
        sandbox.stop()
    if stepped is not None:
        result = stepped
    else:
        if task.submit is None:
            taught = learned(task, mounts.workspace)
            task = dataclasses.replace(task, submit=_remember(task, name, taught) if own else taught)
        evaluation, ground = _verify(task, sandboxes, out, ran, verifier_hosts if task.wants_internet else None)
        result = OracleResult(name, ran, evaluation, allowlist=task.submit, dropped=ground.tampered,
                              notes=ground.notes)
    atomic.write_text(out / "result.json", json.dumps(result.to_result(task), indent=2))
    return result


def oracle_allowlist(task: TaskSpec, runtime: str, scratch: Path) -> Submit | None:
    """The allowlist a task without `submit` takes from its oracle's changes: from the node's cache, else by
    running the oracle once in `scratch` (removed after) while other processes of the node wait for it. None: the
    task has its own `submit`, is multi-step, or ships no oracle (DEFAULT_SUBMIT then)."""
    if task.submit is not None or task.steps or not task.has_oracle:
        return None
    with _locked(_key(task, runtime)) as cached:
        if cached.is_file():
            return Submit.from_dict(json.loads(cached.read_text()))
        shutil.rmtree(scratch, ignore_errors=True)
        try:
            solve = oracle_script(task, scratch / "oracle-script")
            name, resolved, mounts, _sandboxes, sandbox = _start(task, runtime, scratch / "oracle")
            try:
                _solve(resolved, sandbox, mounts, solve, scratch / "oracle")
            finally:
                sandbox.stop()
            submit = learned(resolved, mounts.workspace)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        atomic.write_text(cached, json.dumps(submit.to_dict()))
        return submit


def learned(task: TaskSpec, workspace: Path) -> Submit:
    """What the oracle's work may teach: each regular file it created, changed or deleted against the pristine
    workspace (compiled Python it left behind aside), a repository's whole objects/, refs/ and logs/ when it
    wrote there (a commit's objects have other names in every run), binary where it wrote binary files,
    executable where it made files so; the files the task had stay changeable and new text files stay welcome, as
    for any task."""
    with tempfile.TemporaryDirectory(prefix="polar-pristine-") as tmp:
        base = Path(tmp) / "w"
        pristine(task.workspace, base)
        before, after = entries(base), entries(workspace)
        globs: set[str] = set()
        binary, executable = False, []
        for rel in sorted(set(before) | set(after)):
            b, f = before.get(rel), after.get(rel)
            if f is not None and not stat.S_ISREG(f.st_mode) or _python_cache(rel):
                continue
            if b is not None and f is not None and same_file(base / rel, workspace / rel, b, f) \
                    and (b.st_mode ^ f.st_mode) & 0o100 == 0:
                continue
            globs.update(_git_globs(rel))
            if f is not None:
                binary = binary or _is_binary(workspace / rel)
                if f.st_mode & 0o100 and not (b is not None and b.st_mode & 0o100):
                    executable.append(rel)
    return Submit(tuple(sorted(globs)), existing=True, binary=binary, new=True, executable=tuple(executable),
                  source="oracle")


GIT_DATA = ("objects/**", "refs/**", "logs/**", "index", "HEAD", "ORIG_HEAD", "packed-refs", "COMMIT_EDITMSG")


def _git_globs(rel: str) -> list[str]:
    """The globs a change teaches: itself; for a change in a repository, its data as any commit writes it (the
    agent's commit has other object names than the oracle's, a `git gc` packs them). A repository's config and
    hooks only by name: git runs what they name in the verifier (polar/scoring/allow.py)."""
    parts = rel.split("/")
    if ".git" not in parts[:-1]:
        return [rel]
    repo = "/".join(parts[:parts.index(".git") + 1])
    return [rel, *(f"{repo}/{data}" for data in GIT_DATA)]


def _remember(task: TaskSpec, runtime: str, submit: Submit) -> Submit:
    """Keep what `run_oracle` learned for the task's samples on this node."""
    with _locked(_key(task, runtime)) as cached:
        atomic.write_text(cached, json.dumps(submit.to_dict()))
    return submit


def _key(task: TaskSpec, runtime: str) -> str:
    solution = task.solution.parent if task.solution else None
    content = [task.to_dict(), listing(task.workspace), listing(solution), runtime]
    return hashlib.sha256(json.dumps(content, sort_keys=True, default=str).encode()).hexdigest()[:32]


@contextmanager
def _locked(key: str) -> Iterator[Path]:
    """The cache file of `key`, held under the node's lock for that key (in ~/.cache/polar/oracle; a user whose
    HOME cannot hold it, `nobody` say, keeps it in the temporary folder, under its uid)."""
    folder = CACHE.expanduser()
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:
        folder = Path(tempfile.gettempdir()) / f"polar-oracle-{os.getuid()}"
        folder.mkdir(mode=0o700, exist_ok=True)
    with open(folder / f"{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield folder / f"{key}.json"


def _python_cache(rel: str) -> bool:
    return "/__pycache__/" in f"/{rel}" or rel.endswith((".pyc", ".pyo"))


def _is_binary(path: Path) -> bool:
    with open(path, "rb") as f:
        head = f.read(1 << 20)
    return path.name.endswith(COMPILED_SUFFIXES) or head.startswith(b"\x7fELF") or b"\0" in head


def _start(task: TaskSpec, runtime: str, out: Path) -> tuple[str, TaskSpec, Mounts, Any, Sandbox]:
    """A sandbox of the task's image over a fresh copy of its workspace in `out`, with /solution bound."""
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
    return name, task, mounts, sandboxes, sandbox


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
        evaluation, _ground = _verify(spec, sandboxes, out, ran)
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


def _verify(task: TaskSpec, sandboxes: Any, out: Path, ran: int | None,
            hosts: Sequence[str] | None = None) -> tuple[Evaluation, VerifyGround]:
    """The task's verifier on the oracle's work (behind the egress proxy when `hosts`); with the ground it stood
    on (what the allowlist dropped)."""
    ground = prepare_verify(task, out, {}, {})
    mounts = dataclasses.replace(ground.mounts, root_writable=hosts is not None)
    verifier = sandboxes.prepare(mounts, image=task.image, instance=f"polar-oracle-verify-{uuid.uuid4().hex[:12]}")
    summary = {"sample_id": "oracle", "group_id": task.task_id, "adapter": None, "exit_code": ran,
               "timed_out": ran is None, "task_id": task.task_id, "files_changed": {}}
    try:
        with verifier_egress(verifier, hosts, mounts.shared, out / "egress.jsonl") as verifying:
            return evaluate(task.evaluator, verifying, mounts, out, summary, task.evaluator.timeout_s,
                            task.reward_range), ground
    finally:
        verifier.stop()
