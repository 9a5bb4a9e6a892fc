"""Reading task files into TaskSpec values (polar/tasks/task.py; format: docs/tasks.md).

A task file is YAML (one task mapping, a list of them, or `{tasks: [...]}`) or JSONL (one task per line).
Each task: task_id, instruction, workspace (a directory or a .tar.gz, copied into the sandbox), image (an
Apptainer SIF or sandbox directory, an OCI image for the docker runtime, or `host` for the local/bwrap runtimes),
adapter (optional: the batch's default otherwise), evaluator, timeout_s (the agent's budget), session_timeout_s
(the whole sample), metadata (free-form, carried into the trajectory table); for verification
(polar/scoring/verify.py): tests (a directory staged over the verify workspace, never shown to the agent),
protected (workspace globs the agent may never change), submit (what the agent's work may contribute: workspace
globs, or {files, existing, binary}; none: the files the workspace already has, with one warning line; see
polar/scoring/allow.py), reward_range (default [0, 1]); max_calls (the session's LLM call cap). Relative paths
are relative to the task file, and every path must resolve under the tasks root (polar/tasks/roots.py).
Every error is one line: "FILE:LINE: FIELD: problem".
"""
from __future__ import annotations

import json
import math
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping, Sequence

import yaml

from polar.tasks.expected import expected_tests
from polar.tasks.harbor import load_harbor
from polar.tasks.swe import is_swe, load_swe
from polar.tasks.roots import adapters_root, inside, outside, roots_text, tasks_roots
from polar.tasks.task import (DEFAULT_EVAL_TIMEOUT_S, DEFAULT_MAX_CALLS, DEFAULT_REWARD_RANGE,
                              DEFAULT_TIMEOUT_S, SESSION_MARGIN_S, EvaluatorSpec, TaskError, TaskSpec, parse_globs,
                              parse_submit)
from polar_traj.records import check_id

TASK_KEYS = ("task_id", "instruction", "workspace", "image", "adapter", "evaluator", "timeout_s",
             "session_timeout_s", "metadata", "tests", "protected", "reward_range", "max_calls", "submit")
EVALUATOR_KINDS = ("command", "files", "python", "pytest")
REWARD_SOURCES = ("exit", "stdout", "file")
EVALUATOR_KEYS = {"command": {"command", "reward", "reward_file", "timeout_s"},
                  "files": {"files", "timeout_s"},
                  "python": {"python", "timeout_s"},
                  "pytest": {"pytest", "timeout_s"}}
NO_ORACLE = ("polar: {file}: {tasks} declare(s) no `submit:` and ship(s) no oracle: the agent may change or delete the "
             "files the workspace has and add new text files, never pytest configuration, conftest, start-up hooks, "
             "compiled files or standard-library names (docs/tasks.md \"submit\")")
_PY_TARGET = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*")


@dataclass(frozen=True)
class _Where:
    """Where a task sits in its file: the file, the task's line, and each key's line."""

    file: Path
    line: int
    keys: Mapping[str, int]

    def fail(self, key: str, problem: str) -> TaskError:
        return TaskError(f"{self.file}:{self.keys.get(key.split('.')[0], self.line)}: {key}: {problem}")


def load_tasks(path: str | Path, tasks_root: str | Path | Sequence[str | Path] | None = None) -> list[TaskSpec]:
    """Every task of a YAML or JSONL task file, or of a Harbor task directory or a folder of them
    (polar/tasks/harbor.py), validated; raises TaskError ("FILE:LINE: FIELD: problem"). `tasks_root`: where its
    paths may lead (default: POLAR_TASKS_ROOT, else the file's folder and the current directory)."""
    path = Path(path)
    tasks = _load(path, tasks_roots(path, tasks_root))
    # Without `submit`, a task's oracle teaches its allowlist (polar/scoring/oracle.py); without an oracle either,
    # the default may still drop honest work (a binary answer): one line per task set, however many tasks it names.
    bare = [t.task_id for t in tasks if t.submit is None and not t.has_oracle]
    if bare:
        shown = ", ".join(bare[:5]) + (f" and {len(bare) - 5} more" if len(bare) > 5 else "")
        print(NO_ORACLE.format(file=path, tasks=shown), file=sys.stderr, flush=True)
    return tasks


def _load(path: Path, roots: Sequence[Path]) -> list[TaskSpec]:
    if path.is_dir():
        return load_harbor(path, roots)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise TaskError(f"{path}:0: file: cannot read: {e}") from e
    items = _jsonl_items(path, text) if path.suffix == ".jsonl" else _yaml_items(path, text)
    if path.suffix == ".jsonl" and items and is_swe(items[0][0]):
        return load_swe(path, [(raw, where.line) for raw, where in items], roots)
    tasks, seen = [], {}
    for raw, where in items:
        task = _parse_task(raw, where, path.resolve().parent, roots)
        if task.task_id in seen:
            raise where.fail("task_id", f"{task.task_id!r} already used on line {seen[task.task_id]}")
        seen[task.task_id] = where.keys.get("task_id", where.line)
        tasks.append(task)
    if not tasks:
        raise TaskError(f"{path}:1: tasks: the file holds no task")
    return tasks


def select_task(tasks: list[TaskSpec], task_id: str | None, path: Path) -> TaskSpec:
    if task_id is None:
        if len(tasks) > 1:
            raise TaskError(f"{path}: {len(tasks)} tasks; pick one with --task-id "
                            f"({', '.join(t.task_id for t in tasks)})")
        return tasks[0]
    for t in tasks:
        if t.task_id == task_id:
            return t
    raise TaskError(f"{path}: no task {task_id!r} (tasks: {', '.join(t.task_id for t in tasks)})")


def _jsonl_items(path: Path, text: str) -> list[tuple[Any, _Where]]:
    items = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            raw = json.loads(line)
        except json.JSONDecodeError as e:
            raise TaskError(f"{path}:{n}: json: {e.msg} (column {e.colno})") from e
        items.append((raw, _Where(path, n, {})))
    return items


def _yaml_items(path: Path, text: str) -> list[tuple[Any, _Where]]:
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = mark.line + 1 if mark else 1
        raise TaskError(f"{path}:{line}: yaml: {getattr(e, 'problem', None) or e}") from e
    if node is None:
        return []
    if isinstance(data, dict) and "tasks" in data:
        if set(data) != {"tasks"} or not isinstance(data["tasks"], list):
            raise TaskError(f"{path}:{node.start_mark.line + 1}: tasks: expected `tasks:` holding a list, alone")
        node = next(v for k, v in node.value if k.value == "tasks")
        data = data["tasks"]
    if isinstance(data, dict):
        return [(data, _where_of(path, node))]
    if not isinstance(data, list):
        raise TaskError(f"{path}:1: tasks: expected a task mapping or a list of them, got {type(data).__name__}")
    return [(raw, _where_of(path, n)) for raw, n in zip(data, node.value)]


def _where_of(path: Path, node: yaml.Node) -> _Where:
    keys = {}
    if isinstance(node, yaml.MappingNode):
        keys = {k.value: k.start_mark.line + 1 for k, _v in node.value if isinstance(k, yaml.ScalarNode)}
    return _Where(path, node.start_mark.line + 1, keys)


def _parse_task(raw: Any, where: _Where, base: Path, roots: Sequence[Path]) -> TaskSpec:
    if not isinstance(raw, dict):
        raise where.fail("task", f"expected a mapping, got {raw!r}")
    unknown = sorted(set(map(str, raw)) - set(TASK_KEYS))
    if unknown:
        raise where.fail(unknown[0], f"unknown field (known: {', '.join(TASK_KEYS)})")
    for key in ("task_id", "instruction", "evaluator"):
        if key not in raw:
            raise where.fail(key, "missing")
    try:
        task_id = check_id(raw["task_id"], "task_id")
    except ValueError as e:
        raise where.fail("task_id", str(e)) from e
    instruction = _text(raw["instruction"], "instruction", where)
    timeout = _seconds(raw.get("timeout_s", DEFAULT_TIMEOUT_S), "timeout_s", where)
    evaluator = _parse_evaluator(raw["evaluator"], where)
    session = _seconds(raw.get("session_timeout_s", timeout + evaluator.timeout_s + SESSION_MARGIN_S),
                       "session_timeout_s", where)
    if session < timeout:
        raise where.fail("session_timeout_s", f"{session:g} is shorter than timeout_s {timeout:g}")
    metadata = raw.get("metadata") or {}
    if not isinstance(metadata, dict):
        raise where.fail("metadata", f"expected a mapping, got {metadata!r}")
    adapter = raw.get("adapter")
    if adapter is not None:
        adapter = _adapter(_text(adapter, "adapter", where), where, base, roots)
    tests = _tests(raw.get("tests"), where, base, roots)
    if evaluator.kind == "pytest":
        _check_test_files(evaluator.pytest, tests, where)
    return TaskSpec(task_id, instruction, _workspace(raw.get("workspace"), where, base, roots),
                    _image(raw.get("image", "host"), where, base), adapter, evaluator, timeout, session,
                    MappingProxyType(dict(metadata)), tests,
                    parse_globs(raw.get("protected"), "protected", where.fail), _range(raw.get("reward_range"), where),
                    _count(raw.get("max_calls", DEFAULT_MAX_CALLS), "max_calls", where),
                    submit=parse_submit(raw.get("submit"), "submit", where.fail, list_existing=False))


def _text(value: Any, key: str, where: _Where) -> str:
    if not isinstance(value, str) or not value.strip():
        raise where.fail(key, f"expected a non-empty string, got {value!r}")
    return value


def _seconds(value: Any, key: str, where: _Where) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise where.fail(key, f"expected a positive number of seconds, got {value!r}")
    return float(value)


def _confined(value: Any, key: str, where: _Where, base: Path, roots: Sequence[Path]) -> Path:
    """base/value, refused unless it (every link followed) lies under the tasks root."""
    text = _text(value, key, where)
    path = base / text
    if not inside(path, roots):
        raise where.fail(key, outside(text, roots))
    return path


def _workspace(value: Any, where: _Where, base: Path, roots: Sequence[Path]) -> Path | None:
    if value is None:
        return None
    path = _confined(value, "workspace", where, base, roots)
    if not (path.is_dir() or (path.is_file() and path.name.endswith((".tar.gz", ".tgz")))):
        raise where.fail("workspace", f"{path} is neither a directory nor a .tar.gz file")
    return path.resolve()


def _tests(value: Any, where: _Where, base: Path, roots: Sequence[Path]) -> Path | None:
    if value is None:
        return None
    path = _confined(value, "tests", where, base, roots)
    if not path.is_dir():
        raise where.fail("tests", f"{path} is not a directory")
    return path.resolve()


def _adapter(text: str, where: _Where, base: Path, roots: Sequence[Path]) -> str:
    """A harness name; or an adapter YAML by path, relative to the task file like every path in it: under the tasks
    root or the adapters root, since its `files:` and command run for the task."""
    if not (text.endswith((".yaml", ".yml")) or "/" in text):
        return text
    path = Path(text).expanduser()
    path = path if path.is_absolute() else base / path
    if not inside(path, (*roots, adapters_root())):
        raise where.fail("adapter", f"{text!r} is outside the tasks root {roots_text(roots)} and the adapters root "
                                    f"{adapters_root()}")
    return str(path.resolve())


def _check_test_files(files: tuple[str, ...], tests: Path | None, where: _Where) -> None:
    """A pytest evaluator's files are the task's own: under `tests:`, each holding at least one test."""
    if tests is None:
        raise where.fail("evaluator.pytest", "a pytest evaluator runs the task's own test files: set `tests:`")
    for rel in files:
        try:
            if not expected_tests(tests, rel):
                raise where.fail("evaluator.pytest", f"{rel}: no test function in it (test* functions, "
                                                     "Test* classes' test* methods)")
        except (OSError, SyntaxError, UnicodeDecodeError) as e:
            raise where.fail("evaluator.pytest", f"{rel}: cannot read it under {tests}: {e}") from e


def _range(value: Any, where: _Where) -> tuple[float, float]:
    if value is None:
        return DEFAULT_REWARD_RANGE
    ok = isinstance(value, list) and len(value) == 2 and all(
        isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in value)
    if not ok or value[0] >= value[1]:
        raise where.fail("reward_range", f"expected [low, high] with finite low < high, got {value!r}")
    if not value[0] <= 0 <= value[1]:  # else a sample could pick being masked over its own failure's 0
        raise where.fail("reward_range", f"{value!r} must include 0, the reward of a workspace that fails "
                                         "verification")
    return float(value[0]), float(value[1])


def _count(value: Any, key: str, where: _Where) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise where.fail(key, f"expected a positive whole number, got {value!r}")
    return value


def _image(value: Any, where: _Where, base: Path) -> str:
    """`host`, an OCI reference (`docker://REF`, or `name:tag` where no such path is) as written, or a path (its
    existence is checked when the sample starts: a missing image is an error sample)."""
    text = _text(value, "image", where)
    path = (base / text).resolve()
    oci = text.startswith("docker://") or (":" in text and not text.startswith(("/", ".")) and not path.exists())
    return text if text == "host" or oci else str(path)


def _parse_evaluator(raw: Any, where: _Where) -> EvaluatorSpec:
    if not isinstance(raw, dict):
        raise where.fail("evaluator", f"expected a mapping with one of {', '.join(EVALUATOR_KINDS)}, got {raw!r}")
    kinds = [k for k in EVALUATOR_KINDS if k in raw]
    if len(kinds) != 1:
        raise where.fail("evaluator", f"give exactly one of {', '.join(EVALUATOR_KINDS)}, got {sorted(raw)}")
    kind = kinds[0]
    unknown = sorted(set(raw) - EVALUATOR_KEYS[kind])
    if unknown:
        raise where.fail(f"evaluator.{unknown[0]}", f"unknown for a {kind} evaluator "
                                                    f"(known: {', '.join(sorted(EVALUATOR_KEYS[kind]))})")
    timeout = _seconds(raw.get("timeout_s", DEFAULT_EVAL_TIMEOUT_S), "evaluator.timeout_s", where)
    if kind == "command":
        reward = raw.get("reward", "exit")
        if reward not in REWARD_SOURCES:
            raise where.fail("evaluator.reward", f"{reward!r}: expected one of {', '.join(REWARD_SOURCES)}")
        reward_file = _text(raw.get("reward_file", "reward.txt"), "evaluator.reward_file", where)
        return EvaluatorSpec("command", command=_text(raw["command"], "evaluator.command", where), reward=reward,
                             reward_file=reward_file, timeout_s=timeout)
    if kind == "files":
        files = raw["files"]
        if not isinstance(files, dict) or not files or not all(
                isinstance(k, str) and k and (v is None or isinstance(v, str)) for k, v in files.items()):
            raise where.fail("evaluator.files", "expected a mapping path -> expected text (or null: must exist)")
        bad = [k for k in files if Path(k).is_absolute() or ".." in Path(k).parts]
        if bad:
            raise where.fail("evaluator.files", f"{bad[0]!r}: paths are relative to the workspace, inside it")
        return EvaluatorSpec("files", files=MappingProxyType(dict(files)), timeout_s=timeout)
    if kind == "pytest":
        files = raw["pytest"]
        files = [files] if isinstance(files, str) else files
        if not isinstance(files, list) or not files or not all(isinstance(f, str) and f.strip() for f in files):
            raise where.fail("evaluator.pytest", f"expected a list of test files relative to `tests:`, got {files!r}")
        bad = [f for f in files if Path(f).is_absolute() or ".." in Path(f).parts]
        if bad:
            raise where.fail("evaluator.pytest", f"{bad[0]!r}: paths are relative to `tests:`, inside it")
        return EvaluatorSpec("pytest", pytest=tuple(files), timeout_s=timeout)
    target = raw["python"]
    if not isinstance(target, str) or not _PY_TARGET.fullmatch(target):
        raise where.fail("evaluator.python", f"expected module:function, got {target!r}")
    return EvaluatorSpec("python", python=target, timeout_s=timeout)
