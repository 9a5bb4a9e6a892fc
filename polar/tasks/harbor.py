"""Harbor task directories (docs/tasks.md "Harbor tasks"): the format of terminal-bench 2.0 and Harbor's datasets,
read as Harbor reads them into our TaskSpec.

  task.toml       any `version` / `schema_version` (one warning line for a major version Polar does not know).
                  What Polar uses: [agent] timeout_sec, user; [verifier] timeout_sec, env, user;
                  [environment] docker_image, workdir, env, cpus, memory_mb (or 1.0's memory = "2G"), storage_mb,
                  gpus (a node without them refuses the task), allow_internet / network_mode (`wants_internet`:
                  its agent runs offline, its verifier behind the egress proxy, polar/sandbox/egress.py), healthcheck
                  (a shell line, or {command, timeout_sec}); artifacts (workdir paths, or {source, destination}, kept in
                  the sample folder);
                  [metadata] (carried into the trajectory table). `user` is accepted and mapped onto the
                  unprivileged polar-sandbox user (no sample process is root). Multi-step tasks: [[steps]] (name,
                  min_reward, [steps.agent] timeout_sec, user, [steps.verifier] timeout_sec, env, user,
                  healthcheck) and multi_step_reward_strategy (mean | final), polar/tasks/steps.py. Other keys
                  are Harbor's and are left alone.
  instruction.md  the instruction, as the harness gets it (a multi-step task's: steps/<name>/instruction.md)
  steps/<name>/   a multi-step task's step: instruction.md; tests/ (over the task's tests/), solution/solve.sh,
                  workdir/ (files put into the workspace before the step; its setup.sh runs there instead)
  environment/    Dockerfile (built by the container engine, polar/sandbox/docker.py) unless task.toml names a
                  prebuilt docker_image; neither: the default image (`host`). The agent works in the image's
                  workdir (task.toml's, else the image's WORKDIR), writable, seeded from the image's own files
                  there (polar/sandbox/image_files.py). environment/workspace/, when there, seeds the workspace
                  instead (a Polar addition)
  tests/          test.sh and what it needs: staged read-only at /tests of the verify sandbox only, after the agent
                  finished; its pytest files are first run by Polar's observer (polar/scoring/harbor_observe.py);
                  it writes /logs/verifier/reward.txt (a number) or reward.json ({"reward": main, extras...})
  solution/       solve.sh, never shown to the agent; `polar run --task DIR --oracle` runs it instead of a harness;
                  without `[polar] submit`, what it creates, changes or deletes is the task's allowlist
  [polar] submit  (a Polar addition) workspace globs of NEW files the agent's work may add; the files the
                  workspace held before the run may always be changed or deleted (polar/scoring/allow.py); or a
                  table {files, binary, new, executable}

The task id is the directory's name. The task directory and each of its folders and files Polar uses must resolve
under the tasks root (polar/tasks/roots.py): a link out of it (`environment/workspace -> /home/me`) is refused.
Every error is one line naming the file and the field.
"""
from __future__ import annotations

import datetime
import json
import glob
import math
import os
import re
import sys
import tomllib
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping, Sequence

from polar.tasks.task import (HEALTHCHECK_TIMEOUT_S, LOGS_AT, SESSION_MARGIN_S, SETUP_SCRIPT, SOLUTION_AT,
                              STEP_STRATEGIES, TESTS_AT, EvaluatorSpec, StepSpec, Submit, TaskError, TaskSpec,
                              parse_submit)
from polar.sandbox.agent_files import AgentFileError, read_beneath
from polar.tasks.roots import inside, outside, tasks_roots
from polar_traj.records import check_id

TASK_FILE = "task.toml"
KNOWN_MAJORS = ("1", "2")  # schema versions whose keys Polar reads; another is read with one warning line
UNKNOWN_VERSION = "polar: {file}: schema version {version!r} is newer than Polar knows ({known}.x): read as 2.x"
OFFLINE_NETWORKS = ("none", "no-network", "disabled")  # network_mode values that ask for no network
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
POLAR_PATHS = (TESTS_AT, LOGS_AT, SOLUTION_AT, "/.polar", "/proc", "/dev", "/tmp", "/usr", "/etc")  # not a workdir
DEFAULT_TIMEOUT_S = 600.0  # Harbor's default for the agent and for the verifier
TEST_COMMAND = ("bash", f"{TESTS_AT}/test.sh")
MIN_MEMORY_MB = 16  # polar/sandbox/limits.py's floor
SETUP_LIMIT = 100_000  # characters: it is passed to bash -c (one argument)
_MEMORY = re.compile(r"(\d+(?:\.\d+)?)\s*([KMGT]?)B?", re.I)


def load_harbor(path: Path, roots: Sequence[Path] | None = None) -> list[TaskSpec]:
    """The task of a Harbor task directory, or every task directory directly under a folder, sorted by name.
    `roots`: the tasks root (default polar/tasks/roots.py's for `path`)."""
    roots = tuple(roots) if roots is not None else tasks_roots(path)
    path = Path(path).resolve()
    dirs = [path] if (path / TASK_FILE).is_file() else sorted(p.parent for p in path.glob(f"*/{TASK_FILE}"))
    if not dirs:
        raise TaskError(f"{path}: no {TASK_FILE} in it or in its subfolders (not a Harbor task directory)")
    return [load_harbor_task(d, roots) for d in dirs]


def confine(task_dir: Path, rel: str, roots: Sequence[Path]) -> Path:
    """task_dir/rel, refused (TaskError naming it) when it or a link on its way leads out of the tasks root."""
    path = task_dir / rel if rel else task_dir
    if os.path.lexists(path) and not inside(path, roots):
        raise TaskError(f"{task_dir}: {rel or 'task'}: {outside(str(path.resolve()), roots)}")
    return path


def solution_of(path: Path, task_id: str, tasks_root: Path | None = None) -> Path:
    """solution/solve.sh of the task `task_id` loaded from `path` (its directory, or the folder holding it)."""
    path = Path(path).resolve()
    task_dir = path if (path / TASK_FILE).is_file() else path / task_id
    script = confine(task_dir, "solution/solve.sh", tasks_roots(path, tasks_root))
    if not script.is_file():
        raise TaskError(f"{script}: solution: missing (--oracle runs the task's solution/solve.sh)")
    return script


def _solution(task_dir: Path, roots: Sequence[Path]) -> Path | None:
    """solution/solve.sh when the task ships one (under the tasks root, as every file Polar uses)."""
    script = confine(task_dir, "solution/solve.sh", roots)
    return script if script.is_file() else None


def load_harbor_task(task_dir: Path, roots: Sequence[Path] | None = None) -> TaskSpec:
    roots = tuple(roots) if roots is not None else tasks_roots(task_dir)
    for rel in ("", TASK_FILE, "instruction.md", "tests", "environment", "environment/workspace",
                "environment/Dockerfile"):
        confine(task_dir, rel, roots)
    toml_file = task_dir / TASK_FILE
    try:
        config = tomllib.loads(toml_file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as e:
        raise TaskError(f"{toml_file}: file: cannot read: {e}") from e
    except tomllib.TOMLDecodeError as e:
        raise TaskError(f"{toml_file}: toml: {e}") from e
    fail = lambda key, problem: TaskError(f"{toml_file}: {key}: {problem}")  # noqa: E731
    version = str(config.get("schema_version", config.get("version", "1.0")))
    if version.split(".")[0] not in KNOWN_MAJORS:
        print(UNKNOWN_VERSION.format(file=toml_file, version=version, known="/".join(KNOWN_MAJORS)),
              file=sys.stderr, flush=True)
    agent, verifier, env = (_table(config, k, fail) for k in ("agent", "verifier", "environment"))
    for table, key in ((agent, "agent.user"), (verifier, "verifier.user")):  # mapped onto polar-sandbox
        _user(table, key, fail)
    metadata = _table(config, "metadata", fail)
    try:
        task_id = check_id(task_dir.name, "task_id")
    except ValueError as e:
        raise TaskError(f"{task_dir}: task_id: the directory's name is the task id: {e}") from e
    timeout = _seconds(agent.get("timeout_sec", DEFAULT_TIMEOUT_S), "agent.timeout_sec", fail)
    verify_timeout = _seconds(verifier.get("timeout_sec", DEFAULT_TIMEOUT_S), "verifier.timeout_sec", fail)
    verifier_env = _env(verifier, "verifier.env", fail)
    tests = task_dir / "tests"
    steps = _steps(task_dir, config, timeout, verify_timeout, verifier_env, fail, roots) if "steps" in config else ()
    if steps:  # the root instruction.md is never the agent's; each step's test.sh may stand in for the task's
        instruction = steps[0].instruction
        if not (tests / "test.sh").is_file() and not all(s.tests and (s.tests / "test.sh").is_file() for s in steps):
            raise TaskError(f"{tests / 'test.sh'}: tests: missing, and not every step has steps/<name>/tests/test.sh")
        timeout = sum(s.timeout_s for s in steps)
        verify_timeout = sum(s.verify_timeout_s for s in steps)
    else:
        instruction = _instruction(task_dir / "instruction.md")
        if not (tests / "test.sh").is_file():
            raise TaskError(f"{tests / 'test.sh'}: tests: missing (the verifier Harbor runs)")
    strategy = config.get("multi_step_reward_strategy", "mean")
    if strategy not in STEP_STRATEGIES:
        raise fail("multi_step_reward_strategy", f"expected one of {', '.join(STEP_STRATEGIES)}, got {strategy!r}")
    workspace = task_dir / "environment" / "workspace"
    cpus = None if env.get("cpus") is None else _positive(env["cpus"], "environment.cpus", fail)
    memory = _memory(env, fail)
    storage = None if env.get("storage_mb") is None else int(_positive(env["storage_mb"], "environment.storage_mb",
                                                                            fail))
    gpus = _gpus(env, fail)
    workdir = _workdir(env, fail)
    check, check_timeout = _healthcheck(env, fail)
    harbor = {k: v for k, v in {"cpus": cpus, "memory_mb": memory, "storage_mb": storage}.items() if v is not None}
    meta = {**_plain(metadata), "harbor": {**_plain({k: v for k, v in config.items() if k in ("task", "source")}),
                                           **harbor}}
    return TaskSpec(task_id, instruction, workspace.resolve() if workspace.is_dir() else None,
                    _image(task_dir, env, fail), None,
                    EvaluatorSpec("harbor", command=" ".join(TEST_COMMAND),
                                  timeout_s=steps[-1].verify_timeout_s if steps else verify_timeout, env=verifier_env),
                    timeout, timeout + verify_timeout + SESSION_MARGIN_S, MappingProxyType(meta),
                    tests.resolve() if tests.is_dir() else None,
                    memory_mb=memory, cpus=cpus, submit=_submit(_table(config, "polar", fail), fail),
                    workdir=workdir, env=_env(env, "environment.env", fail), storage_mb=storage,
                    wants_internet=_wants_internet(env, fail), healthcheck=check, healthcheck_timeout_s=check_timeout,
                    artifacts=_artifacts(config.get("artifacts", env.get("artifacts")), workdir, fail),
                    steps=steps, step_reward=strategy, solution=_solution(task_dir, roots), gpus=gpus)


def _instruction(path: Path) -> str:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise TaskError(f"{path}: instruction: missing (a Harbor task needs instruction.md)") from None
    except (OSError, UnicodeDecodeError) as e:
        raise TaskError(f"{path}: instruction: cannot read: {e}") from e
    if not text.strip():
        raise TaskError(f"{path}: instruction: empty")
    return text


def _user(table: Mapping[str, Any], key: str, fail: Any) -> None:
    """A Harbor `user`: accepted as a name or id, and mapped onto polar-sandbox (no sample process is root)."""
    user = table.get("user")
    if user is not None and (isinstance(user, bool) or not isinstance(user, (str, int))):
        raise fail(key, f"expected a user name or id, got {user!r}")


def _steps(task_dir: Path, config: Mapping[str, Any], timeout: float, verify_timeout: float,
           verifier_env: Mapping[str, str], fail: Any, roots: Sequence[Path]) -> tuple[StepSpec, ...]:
    """[[steps]] and their folders steps/<name>/ (instruction.md; tests/, solution/solve.sh, workdir/ with its
    setup.sh, each optional). A step's [steps.agent] and [steps.verifier] fall back to the task's."""
    tables = config["steps"]
    if not isinstance(tables, list) or not tables or not all(isinstance(t, dict) for t in tables):
        raise fail("steps", "expected one or more [[steps]] tables")
    steps, seen = [], set()
    for i, table in enumerate(tables):
        where = f"steps[{i}]"
        name = table.get("name")
        try:
            check_id(name, "the step's name")  # type: ignore[arg-type]
        except ValueError as e:
            raise fail(f"{where}.name", str(e)) from None
        if name in seen:
            raise fail(f"{where}.name", f"{name!r} is the name of an earlier step")
        seen.add(name)
        folder = confine(task_dir, f"steps/{name}", roots)
        for rel in ("instruction.md", "tests", "solution", "workdir", "workdir/setup.sh"):
            confine(task_dir, f"steps/{name}/{rel}", roots)
        if not folder.is_dir():
            raise TaskError(f"{folder}: {where}: the step's folder is missing (steps/<name>/instruction.md)")
        agent, verifier = _table(table, "agent", fail), _table(table, "verifier", fail)
        _user(agent, f"{where}.agent.user", fail)
        _user(verifier, f"{where}.verifier.user", fail)
        check, check_timeout = _healthcheck(table, fail, f"{where}.healthcheck")
        files, tests, solve = folder / "workdir", folder / "tests", folder / "solution" / "solve.sh"
        steps.append(StepSpec(
            name, _instruction(folder / "instruction.md"),
            _seconds(agent.get("timeout_sec", timeout), f"{where}.agent.timeout_sec", fail),
            _seconds(verifier.get("timeout_sec", verify_timeout), f"{where}.verifier.timeout_sec", fail),
            MappingProxyType({**verifier_env, **_env(verifier, f"{where}.verifier.env", fail)}),
            files.resolve() if files.is_dir() else None, _setup(files / SETUP_SCRIPT),
            tests.resolve() if tests.is_dir() else None, solve.resolve() if solve.is_file() else None,
            _min_reward(table.get("min_reward"), f"{where}.min_reward", fail), check, check_timeout))
    return tuple(steps)


def _setup(path: Path) -> str | None:
    """A step's workdir/setup.sh, as text: it runs before the step's agent and is not copied into the workspace."""
    if not path.is_file():
        return None
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise TaskError(f"{path}: setup: cannot read: {e}") from e
    if len(text) > SETUP_LIMIT:
        raise TaskError(f"{path}: setup: {len(text)} characters, more than {SETUP_LIMIT}: ship its data as "
                        "workdir files and keep setup.sh a script")
    return text


def _min_reward(value: Any, key: str, fail: Any) -> float | MappingProxyType | None:
    """A floor on the step's reward (a number) or on its named rewards (a table of numbers)."""
    number = lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)  # noqa: E731
    if value is None or number(value):
        return None if value is None else float(value)
    if isinstance(value, dict) and value and all(number(v) for v in value.values()):
        return MappingProxyType({str(k): float(v) for k, v in value.items()})
    raise fail(key, f"expected a number or a table of named rewards, got {value!r}")


def _workdir(env: Mapping[str, Any], fail: Any) -> str | None:
    """[environment] workdir: an absolute path, where the agent works (None: the image's WORKDIR)."""
    value = env.get("workdir")
    if value is None:
        return None
    if not isinstance(value, str) or not value.startswith("/") or ".." in value.split("/"):
        raise fail("environment.workdir", f"expected an absolute path, got {value!r}")
    path = os.path.normpath(value)
    clash = "/" if path == "/" else next((p for p in POLAR_PATHS if path == p or path.startswith(p + "/")
                                          or p.startswith(path + "/")), None)
    if clash:
        raise fail("environment.workdir", f"{path}: overlaps {clash}, which the sandbox keeps for itself")
    return path


def _env(table: Mapping[str, Any], key: str, fail: Any) -> MappingProxyType:
    """A table of environment variables: names as the shell takes them, values as text."""
    value = table.get("env", {})
    if not isinstance(value, dict):
        raise fail(key, f"expected a table of variables, got {value!r}")
    out = {}
    for name, v in value.items():
        if not _ENV_NAME.fullmatch(name) or isinstance(v, (dict, list)) or v is None or "\0" in str(v):
            raise fail(key, f"{name} = {v!r}: expected NAME = \"text\"")
        out[name] = str(v).lower() if isinstance(v, bool) else str(v)
    return MappingProxyType(out)


def _wants_internet(env: Mapping[str, Any], fail: Any) -> bool:
    allow, mode = env.get("allow_internet"), env.get("network_mode")
    if allow is not None and not isinstance(allow, bool):
        raise fail("environment.allow_internet", f"expected true or false, got {allow!r}")
    if mode is not None and not isinstance(mode, str):
        raise fail("environment.network_mode", f"expected a network mode, got {mode!r}")
    return bool(allow) or (mode is not None and mode not in OFFLINE_NETWORKS)


def _gpus(env: Mapping[str, Any], fail: Any) -> int:
    """[environment] gpus: how many the task asks for (a node without that many refuses it: polar/run/preflight.py;
    Polar's sandboxes bind no GPU either way)."""
    gpus = env.get("gpus")
    if gpus is None:
        return 0
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 0:
        raise fail("environment.gpus", f"expected a number of GPUs, got {gpus!r}")
    return gpus


def _healthcheck(env: Mapping[str, Any], fail: Any, key: str = "environment.healthcheck"
                 ) -> tuple[str | None, float]:
    """[environment] healthcheck (or a step's): a shell line (or an argv list), or {command, timeout_sec}."""
    check, timeout = env.get("healthcheck"), HEALTHCHECK_TIMEOUT_S
    if isinstance(check, dict):
        if check.get("timeout_sec") is not None:
            timeout = _seconds(check["timeout_sec"], f"{key}.timeout_sec", fail)
        check = check.get("command", check.get("cmd"))
    if check is None:
        return None, timeout
    if isinstance(check, list) and all(isinstance(a, str) for a in check):
        check = " ".join(check)
    if not isinstance(check, str) or not check.strip():
        raise fail(key, f"expected a shell line or {{command = ...}}, got {check!r}")
    return check, timeout


def _artifacts(value: Any, workdir: str | None, fail: Any) -> tuple[tuple[str, str], ...]:
    """(path kept, its name under the sample's artifacts/): a path relative to the workspace or absolute under the
    workdir, or Harbor's {source = PATH, destination = NAME} (source may then be the whole workdir)."""
    if value is None:
        return ()
    if not isinstance(value, list):
        raise fail("artifacts", f"expected a list of paths, got {value!r}")
    out = []
    for v in value:
        source, name = (v.get("source"), v.get("destination")) if isinstance(v, dict) else (v, None)
        if isinstance(v, dict) and set(v) - {"source", "destination"}:
            raise fail("artifacts", f"{v}: Polar reads source and destination, not "
                                    f"{', '.join(sorted(set(v) - {'source', 'destination'}))}")
        if not isinstance(source, str) or not source.strip() or not isinstance(name, (str, type(None))):
            raise fail("artifacts", f"expected a path or {{source = PATH, destination = NAME}}, got {v!r}")
        rel = source
        if source.startswith("/"):
            if not workdir or not (source + "/").startswith(workdir.rstrip("/") + "/"):
                raise fail("artifacts", f"{source}: only paths in the workdir ({workdir or 'none'}) can be kept")
            rel = os.path.relpath(source, workdir)
        name = os.path.normpath(name if name is not None else rel)
        for path in (rel, name):
            if ".." in Path(path).parts or path.startswith("/"):
                raise fail("artifacts", f"{path}: expected a path inside the workdir")
        if name == ".":
            raise fail("artifacts", f"{source}: the whole workdir needs a destination name" if rel == "." else
                       f"{source}: expected a destination name")
        out.append((rel, name))
    return tuple(out)


def _submit(polar: Mapping[str, Any], fail: Any) -> Submit | None:
    """`[polar] submit`: globs of the files the agent's work may add (the workspace's own files may always change),
    or a table of polar/tasks/task.py's SUBMIT_KEYS (`binary = true` for git objects, say); absent: None, the
    oracle's changes (solution/solve.sh), else the default allowlist."""
    return parse_submit(polar.get("submit"), "polar.submit", fail, list_existing=True)


def _table(config: Mapping[str, Any], key: str, fail: Any) -> dict[str, Any]:
    value = config.get(key, {})
    if not isinstance(value, dict):
        raise fail(key, f"expected a table [{key}], got {value!r}")
    return value


def _seconds(value: Any, key: str, fail: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise fail(key, f"expected a positive number of seconds, got {value!r}")
    return float(value)


def _positive(value: Any, key: str, fail: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise fail(key, f"expected a positive number, got {value!r}")
    return float(value)


def _memory(env: Mapping[str, Any], fail: Any) -> int | None:
    """Megabytes: memory_mb (1.1+), or 1.0's memory = "2G" / "512M"; at least MIN_MEMORY_MB."""
    if env.get("memory_mb") is not None:
        key, mb = "environment.memory_mb", int(_positive(env["memory_mb"], "environment.memory_mb", fail))
    elif env.get("memory") is not None:
        key, m = "environment.memory", _MEMORY.fullmatch(str(env["memory"]).strip())
        if not m:
            raise fail(key, f"expected a size like '2G' or '512M', got {env['memory']!r}")
        scale = {"": 1 / (1 << 20), "K": 1 / 1024, "M": 1, "G": 1024, "T": 1 << 20}[m.group(2).upper()]
        mb = int(float(m.group(1)) * scale)
    else:
        return None
    if mb < MIN_MEMORY_MB:
        raise fail(key, f"{mb} MB: a sandbox needs at least {MIN_MEMORY_MB} MB")
    return mb


def _image(task_dir: Path, env: Mapping[str, Any], fail: Any) -> str:
    """A prebuilt image (docker_image), else environment/Dockerfile (built where the sample runs), else `host`."""
    prebuilt = env.get("docker_image")
    if prebuilt is not None:
        if not isinstance(prebuilt, str) or not prebuilt.strip():
            raise fail("environment.docker_image", f"expected an image reference, got {prebuilt!r}")
        return prebuilt if prebuilt.startswith("docker://") or ":" in prebuilt else f"{prebuilt}:latest"
    dockerfile = task_dir / "environment" / "Dockerfile"
    return str(dockerfile.resolve()) if dockerfile.is_file() else "host"


def _plain(value: Any) -> Any:
    """TOML values as JSON (dates as ISO text), for the trajectory table's metadata."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, (datetime.date, datetime.time)):
        return value.isoformat()
    return value


# -- the verifier's reward ----------------------------------------------------------------------------------------
REWARD_FILES = ("reward.json", "reward.txt")


def read_reward(logs: Path, bounds: tuple[float, float] = (0.0, 1.0)
                ) -> tuple[float | None, dict[str, float] | None, str | None]:
    """(reward, every named reward, problem) from `logs`/verifier: reward.json ({"reward": main, extras...} or a
    single entry) or reward.txt (one number). Both at once, a link, a value that is not a finite number within
    `bounds`: a problem (the agent's code under test could have written any of them). Read without following
    links. No file at all: (None, None, None)."""
    present = [name for name in REWARD_FILES if os.path.lexists(logs / "verifier" / name)]
    if len(present) > 1:
        return None, None, "both reward.json and reward.txt in /logs/verifier (test.sh writes one)"
    if not present:
        return None, None, None
    reward, rewards, problem = (_reward_json if present[0] == "reward.json" else _reward_txt)(logs)
    if problem is not None:
        return None, None, problem
    if not (math.isfinite(reward) and bounds[0] <= reward <= bounds[1]):
        return None, None, f"{present[0]}: reward {reward!r} is not a number in [{bounds[0]:g}, {bounds[1]:g}]"
    if rewards and not all(math.isfinite(v) for v in rewards.values()):
        return None, None, f"reward.json: a named reward is not a finite number: {rewards}"
    return reward, rewards, None


def _reward_json(logs: Path) -> tuple[float, dict[str, float] | None, str | None]:
    try:
        data = json.loads(read_beneath(logs, "verifier/reward.json").decode(errors="replace"))
    except (AgentFileError, ValueError) as e:
        return math.nan, None, f"reward.json: {e}"
    if not isinstance(data, dict) or not data or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in data.values()):
        return math.nan, None, f"reward.json is not a mapping of names to numbers: {str(data)[:100]!r}"
    if "reward" not in data and len(data) != 1:
        return math.nan, None, f"reward.json names no main `reward` among {', '.join(sorted(data))}"
    main = data.get("reward", next(iter(data.values())))
    return float(main), {str(k): float(v) for k, v in data.items()}, None


def _reward_txt(logs: Path) -> tuple[float, None, str | None]:
    try:
        text = read_beneath(logs, "verifier/reward.txt").decode(errors="replace").strip()
    except AgentFileError as e:
        return math.nan, None, f"reward.txt: {e}"
    try:
        return float(text), None, None
    except ValueError:
        return math.nan, None, f"reward.txt is not a number ({text[:100]!r})"
