"""SWE-style instances (the SWE-bench / SWE-Gym shape) as tasks (issue 43, docs/tasks.md "SWE-style instances").

A JSONL file whose lines hold `instance_id`, `repo`, `base_commit`, `problem_statement`, `test_patch`,
`FAIL_TO_PASS` and `PASS_TO_PASS` (lists of pytest ids, or the JSON text of one as SWE-bench ships them); `patch`
(the gold patch) and `image` are optional. `repo` is a local git repository (a path relative to the file, under
the tasks root): nothing is fetched. Each instance becomes a task:
  workspace   the repository's tree at base_commit, made once per (repository, commit) into the cache
              (POLAR_SWE_CACHE, default ~/.cache/polar/swe), with a fresh git history of one commit: `git diff`
              shows the agent's work, and no later commit (the fix) is in it
  tests       every file the test patch touches or that holds a FAIL_TO_PASS / PASS_TO_PASS test, as it is at
              base_commit with the test patch applied: staged over the verify workspace, so the agent's version of
              them never counts (the test patch is applied by construction)
  evaluator   pytest on exactly the FAIL_TO_PASS and PASS_TO_PASS ids, under Polar's runner
              (polar/scoring/observer.py): reward 1 only when every one of them passed, per test
  submit      the repository's files may change or go; new files only where the instance's optional `submit`
              (workspace globs) says, none by default (polar/scoring/allow.py)
`problem_statement` is the instruction. Every error is one line naming the file, the line and the field.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from types import MappingProxyType
from typing import Any, Sequence

from polar.tasks.roots import inside, outside
from polar.tasks.task import (DEFAULT_EVAL_TIMEOUT_S, DEFAULT_TIMEOUT_S, SESSION_MARGIN_S, EvaluatorSpec, TaskError,
                              TaskSpec, parse_submit)
from polar_traj.atomic import made_once
from polar_traj.records import check_id

KEYS = ("instance_id", "repo", "base_commit", "problem_statement", "test_patch", "FAIL_TO_PASS", "PASS_TO_PASS")
CACHE_ENV = "POLAR_SWE_CACHE"
DEFAULT_CACHE = "~/.cache/polar/swe"
GIT_ENV = {"GIT_AUTHOR_NAME": "polar", "GIT_AUTHOR_EMAIL": "polar@localhost", "GIT_COMMITTER_NAME": "polar",
           "GIT_COMMITTER_EMAIL": "polar@localhost", "GIT_AUTHOR_DATE": "2000-01-01T00:00:00Z",
           "GIT_COMMITTER_DATE": "2000-01-01T00:00:00Z", "GIT_CONFIG_GLOBAL": "/dev/null",
           "GIT_CONFIG_NOSYSTEM": "1"}


def is_swe(first: Any) -> bool:
    """Whether a JSONL line is an instance (else it is one of Polar's own tasks)."""
    return isinstance(first, dict) and "instance_id" in first and "base_commit" in first


def load_swe(path: Path, items: Sequence[tuple[Any, int]], roots: Sequence[Path]) -> list[TaskSpec]:
    """The tasks of the instances `items` ((parsed line, line number)) of the JSONL file `path`."""
    tasks, seen = [], {}
    for raw, line in items:
        task = _instance(path, raw, line, roots)
        if task.task_id in seen:
            raise TaskError(f"{path}:{line}: instance_id: {task.task_id!r} already used on line {seen[task.task_id]}")
        seen[task.task_id] = line
        tasks.append(task)
    return tasks


def _instance(path: Path, raw: Any, line: int, roots: Sequence[Path]) -> TaskSpec:
    def fail(key: str, problem: str) -> TaskError:
        return TaskError(f"{path}:{line}: {key}: {problem}")

    if not isinstance(raw, dict):
        raise fail("instance", f"expected an object, got {type(raw).__name__}")
    missing = [k for k in KEYS if k not in raw]
    if missing:
        raise fail(missing[0], "missing (an instance needs " + ", ".join(KEYS) + ")")
    try:
        task_id = check_id(str(raw["instance_id"]), "instance_id")
    except ValueError as e:
        raise fail("instance_id", str(e)) from None
    for key in ("problem_statement", "base_commit", "test_patch", "repo"):
        if not isinstance(raw[key], str) or not raw[key].strip():
            raise fail(key, f"expected text, got {raw[key]!r}")
    repo = _repo(path, raw["repo"], roots, fail)
    fail_to_pass, pass_to_pass = _ids(raw["FAIL_TO_PASS"], "FAIL_TO_PASS", fail), \
        _ids(raw["PASS_TO_PASS"], "PASS_TO_PASS", fail)
    if not fail_to_pass:
        raise fail("FAIL_TO_PASS", "empty: an instance is about at least one failing test")
    workspace = base_tree(repo, raw["base_commit"], fail)
    test_files = sorted({i.partition("::")[0] for i in fail_to_pass + pass_to_pass} | _patched(raw["test_patch"]))
    tests = _tests_with_patch(repo, raw["base_commit"], raw["test_patch"], test_files, fail)
    for i in fail_to_pass + pass_to_pass:
        if not (tests / i.partition("::")[0]).is_file():
            raise fail("FAIL_TO_PASS" if i in fail_to_pass else "PASS_TO_PASS",
                       f"{i}: no such test file at base_commit with the test patch")
    timeout = float(raw.get("timeout_s", DEFAULT_TIMEOUT_S))
    metadata = {"swe": {"repo": raw["repo"], "base_commit": raw["base_commit"], "FAIL_TO_PASS": fail_to_pass,
                        "PASS_TO_PASS": pass_to_pass}}
    if isinstance(raw.get("patch"), str):
        metadata["swe"]["patch"] = raw["patch"]
    evaluator = EvaluatorSpec("pytest", pytest=tuple(fail_to_pass + pass_to_pass), timeout_s=DEFAULT_EVAL_TIMEOUT_S)
    return TaskSpec(task_id, raw["problem_statement"], workspace, str(raw.get("image") or "host"),
                    raw.get("adapter"), evaluator, timeout, timeout + DEFAULT_EVAL_TIMEOUT_S + SESSION_MARGIN_S,
                    MappingProxyType(metadata), tests, submit=parse_submit(raw.get("submit"), "submit", fail, list_existing=True))


def _repo(path: Path, repo: str, roots: Sequence[Path], fail: Any) -> Path:
    """The instance's repository: a local one, or a git bundle (cloned once into the cache)."""
    where = (path.resolve().parent / repo).resolve()
    if not inside(where, roots):
        raise fail("repo", outside(str(where), roots))
    if where.is_file() and where.suffix == ".bundle":
        return _unbundled(where, fail)
    if not (where / ".git").exists() and not (where / "HEAD").is_file():
        raise fail("repo", f"{repo}: not a local git repository or bundle (instances run offline: clone it beside "
                           "the file and name its path)")
    return where


def _unbundled(bundle: Path, fail: Any) -> Path:
    def make(tmp: Path) -> None:
        done = subprocess.run(["git", "clone", "-q", "--bare", str(bundle), str(tmp)], capture_output=True,
                              text=True, timeout=300, env={**os.environ, **GIT_ENV})  # into the empty folder
        if done.returncode != 0:
            raise fail("repo", f"{bundle}: not a git bundle git can clone: {_said(done.stderr)}")

    key = hashlib.sha256(bundle.read_bytes()).hexdigest()[:20]
    return made_once(cache_root() / "bundles" / key, make)  # the bare clone itself, as caches made before hold


def _ids(value: Any, key: str, fail: Any) -> list[str]:
    if isinstance(value, str):  # SWE-bench ships these as JSON text
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            raise fail(key, f"expected a list of test ids (or its JSON text), got {value[:80]!r}") from None
    if not isinstance(value, list) or not all(isinstance(i, str) and i.strip() for i in value):
        raise fail(key, f"expected a list of test ids, got {value!r}")
    bad = [i for i in value if "::" not in i or i.startswith("/") or ".." in Path(i.partition("::")[0]).parts]
    if bad:
        raise fail(key, f"{bad[0]!r}: expected a pytest id, path/to/test_file.py::test_name, inside the repository")
    return list(value)


def _patched(patch: str) -> set[str]:
    """The files a unified diff changes (its `+++ b/…` lines), not /dev/null."""
    return {line[6:].split("\t")[0].strip() for line in patch.splitlines() if line.startswith("+++ b/")}


def _git(repo: Path, *args: str, input: str | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, **GIT_ENV}
    return subprocess.run(["git", "-C", str(cwd or repo), *args], capture_output=True, text=True, input=input,
                          env=env, timeout=300)


def cache_root() -> Path:
    return Path(os.environ.get(CACHE_ENV) or DEFAULT_CACHE).expanduser()


def base_tree(repo: Path, commit: str, fail: Any) -> Path:
    """The repository's tree at `commit` with a git history of its own (one commit), made once."""
    found = _git(repo, "rev-parse", "--verify", f"{commit}^{{commit}}")
    if found.returncode != 0:
        raise fail("base_commit", f"{commit}: not a commit of {repo}")
    full = found.stdout.strip()

    def make(tmp: Path) -> None:
        _export(repo, full, tmp, fail)
        for args in (("init", "-q"), ("add", "-A"), ("commit", "-q", "-m", f"base {full[:12]}")):
            done = _git(tmp, *args, cwd=tmp)
            if done.returncode != 0:
                raise fail("repo", f"git {args[0]} of the base tree failed: {_said(done.stderr)}")

    return made_once(cache_root() / hashlib.sha256(str(repo).encode()).hexdigest()[:16] / full, make)


def _export(repo: Path, commit: str, dest: Path, fail: Any) -> None:
    archive = subprocess.run(["git", "-C", str(repo), "archive", "--format=tar", commit], capture_output=True,
                             timeout=300, env={**os.environ, **GIT_ENV})
    if archive.returncode != 0:
        raise fail("base_commit", f"git archive {commit[:12]} failed: {_said(archive.stderr.decode(errors='replace'))}")
    untar = subprocess.run(["tar", "-x", "-C", str(dest), "--no-same-owner"], input=archive.stdout,
                           capture_output=True, timeout=300)
    if untar.returncode != 0:
        raise fail("repo", f"cannot unpack the base tree: {_said(untar.stderr.decode(errors='replace'))}")


def _tests_with_patch(repo: Path, commit: str, patch: str, files: list[str], fail: Any) -> Path:
    """The test files at `commit` with the test patch applied, made once (keyed by the patch too)."""
    key = hashlib.sha256(f"{repo}\0{commit}\0{patch}\0{files}".encode()).hexdigest()[:20]

    def make(out: Path) -> None:
        with tempfile.TemporaryDirectory(dir=out.parent) as tree:
            _export(repo, commit, Path(tree), fail)
            applied = subprocess.run(["git", "apply", "-"], cwd=tree, input=patch, text=True, capture_output=True,
                                     timeout=120, env={**os.environ, **GIT_ENV})  # refuses paths out of the tree
            if applied.returncode != 0:
                raise fail("test_patch", f"does not apply at base_commit: {_said(applied.stderr or applied.stdout)}")
            for rel in files:
                src = Path(tree) / rel
                if src.is_file() and not src.is_symlink():
                    (out / rel).parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(src, out / rel)

    return made_once(cache_root() / "tests" / key, make)


def _said(text: str) -> str:
    """A tool's complaint on one line (an error is one line)."""
    return " ".join(text.split())[-200:]
