"""Request bodies of `polar api` (pydantic: an unknown or bad field is a 422 that names it) and how each maps
onto a batch: a list of task entries (polar/tasks/load.py's format) and the batch's settings."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from polar.tasks.roots import ADAPTERS_ROOT_ENV, adapters_root, inside

Strategy = Literal["prefix_merging", "prefix_merge", "per_request"]
HOST_RUNTIMES = ("bwrap", "local")  # runtimes whose tasks run on the node's own filesystem: image "host"
# A body naming the container runtime without an image runs in the demo task image, as `make setup` imports it
# into podman (scripts/setup_podman.sh); a node with POLAR_RUNTIME=auto runs an OCI image in the container engine.
DEFAULT_IMAGES = {"docker": "polar-tasks:local"}
BODY_RUNTIMES = ("auto", "bwrap", "local", "apptainer", "docker")


class Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TaskFields(Body):
    """One task, as in a tasks file (docs/tasks.md); paths are on the service's shared storage."""

    task_id: str
    instruction: str
    evaluator: dict[str, Any]
    workspace: str | None = None
    image: str | None = None
    adapter: str | None = None
    timeout_s: float | None = Field(None, gt=0)
    session_timeout_s: float | None = Field(None, gt=0)
    metadata: dict[str, Any] | None = None
    tests: str | None = None
    protected: list[str] | None = None
    submit: list[str] | dict[str, Any] | None = None  # what the agent's work may contribute (docs/tasks.md)
    reward_range: list[float] | None = None
    max_calls: int | None = Field(None, ge=1)


class ShortTask(Body):
    """`POST /api/tasks`: a harness, a runtime, a strategy and either one task's fields or `tasks`."""

    harness: str
    runtime: str | None = None
    trajectory_strategy: Strategy = "prefix_merging"
    group_size: int = Field(4, ge=1, le=999)
    min_groups: int | None = Field(None, ge=1)
    max_staleness: int | None = Field(None, ge=0)
    sampling: dict[str, Any] | None = None
    callback_url: str | None = Field(None, pattern=r"^https?://")
    tasks: list[TaskFields] | None = None
    # A Harbor task folder, or a folder of them, on the service's shared storage under its tasks root: submitted
    # as `polar submit FOLDER` submits it (its own evaluator: tests/test.sh)
    harbor: str | None = None
    task_id: str | None = None
    instruction: str | None = None
    evaluator: dict[str, Any] | None = None
    workspace: str | None = None
    image: str | None = None
    timeout_s: float | None = Field(None, gt=0)
    metadata: dict[str, Any] | None = None
    tests: str | None = None
    protected: list[str] | None = None
    submit: list[str] | dict[str, Any] | None = None


class Agent(Body):
    harness: str
    model_name: str | None = None
    env: dict[str, str] = {}


class Builder(Body):
    strategy: Strategy = "prefix_merging"


class TaskRequest(Body):
    """`POST /rollout/task/submit`, Polar's rollout-server shape: one task, `num_samples` sessions of it."""

    task_id: str
    instruction: str
    agent: Agent
    evaluator: dict[str, Any]
    num_samples: int = Field(1, ge=1, le=999)
    dispatch_priority: int = 0
    early_stop_min_usable_sessions: int | None = Field(None, ge=1)
    timeout_seconds: float | None = Field(None, gt=0)
    runtime: str | None = None
    builder: Builder = Builder()
    callback_url: str | None = Field(None, pattern=r"^https?://")
    metadata: dict[str, Any] = {}
    workspace: str | None = None  # beyond Polar's TaskRequest: our tasks carry a workspace and an image
    image: str | None = None
    tests: str | None = None
    submit: list[str] | dict[str, Any] | None = None  # what the agent's work may contribute (docs/tasks.md)


class PolicyPause(Body):
    timeout_s: float = Field(120.0, gt=0, le=3600)


class BadRequest(ValueError):
    """A body that parses but cannot be a batch; `field` is the body's field at fault (the 422 names it)."""

    def __init__(self, field_name: str, problem: str) -> None:
        super().__init__(f"{field_name}: {problem}")
        self.field = field_name


@dataclass(frozen=True)
class Submission:
    """What a body asks for, in the client's terms (workers/client.py RedisTransport.submit)."""

    tasks: list[dict[str, Any]]
    group_size: int
    adapter: str | None = None
    min_groups: int | None = None
    max_staleness: int | None = None
    sampling: dict[str, Any] | None = None
    callback_url: str | None = None
    strategy: str = "prefix_merge"  # polar_traj's name
    extra: dict[str, Any] = field(default_factory=dict)  # recorded with the batch (GET shows it), not enforced
    size_field: str = "group_size"  # the body's field a too-large batch is blamed on
    folder: Path | None = None  # a Harbor folder submitted as is (`tasks` then only names its tasks)

    @property
    def samples(self) -> int:
        return self.group_size * len(self.tasks)


def _strategy(value: str) -> str:
    """Polar's rollout-server name (prefix_merging) or polar_traj's (prefix_merge, per_request) -> polar_traj's."""
    return "prefix_merge" if value == "prefix_merging" else value


def _image(image: str | None, runtime: str | None) -> str | None:
    """A task's image under the body's runtime: `host` for bwrap/local, the runtime's default image for docker;
    a runtime Polar has not, or apptainer without an image, is refused (it once ran in bwrap, silently)."""
    if runtime is not None and runtime not in BODY_RUNTIMES:
        raise BadRequest("runtime", f"{runtime!r}: expected one of {', '.join(BODY_RUNTIMES)}")
    if image is not None:
        return image
    if runtime in HOST_RUNTIMES:
        return "host"
    if runtime in DEFAULT_IMAGES:
        return DEFAULT_IMAGES[runtime]
    if runtime == "apptainer":
        raise BadRequest("image", "runtime apptainer needs the task's image (a SIF or sandbox directory); "
                                  "only docker has a default (polar-tasks:local)")
    return image


def _harness(value: str | None, field_name: str) -> str | None:
    """A harness name as is; an adapter YAML by path (relative: to the adapters root) only from under the adapters
    root: its `files:` and command run on the node, so a body may not point at a YAML of its own making."""
    if value is None or not (value.endswith((".yaml", ".yml")) or "/" in value):
        return value
    root = adapters_root()
    path = root / value  # an absolute value stays itself
    if not inside(path, (root,)):
        raise BadRequest(field_name, f"{value!r} is outside the adapters root {root} ({ADAPTERS_ROOT_ENV} names "
                                     "another)")
    return str(path.resolve())


def _entry(fields: dict[str, Any], root: Path) -> dict[str, Any]:
    """A task entry without unset fields, its relative paths made absolute under the service's tasks root."""
    entry = {k: v for k, v in fields.items() if v is not None}
    for k in ("workspace", "tests"):
        if k in entry and not Path(entry[k]).is_absolute():
            entry[k] = str(root / entry[k])
    if "image" in entry and entry["image"] != "host" and "/" in entry["image"] and not Path(entry["image"]).is_absolute() \
            and (root / entry["image"]).exists():
        entry["image"] = str(root / entry["image"])
    return entry


def from_short(body: ShortTask, root: Path) -> Submission:
    single = {k: getattr(body, k) for k in ("task_id", "instruction", "evaluator", "workspace", "image", "timeout_s",
                                            "metadata", "tests", "protected", "submit")}
    if body.harbor is not None:
        if body.tasks is not None or any(v is not None for v in single.values()):
            raise BadRequest("harbor", "give a Harbor folder, tasks, or one task's fields: one of them")
        return _from_harbor(body, root)
    if body.tasks is not None:
        if any(v is not None for v in single.values()):
            raise BadRequest("tasks", "give either tasks or one task's fields (task_id, instruction, …), not both")
        raw = [t.model_dump() for t in body.tasks]
    else:
        for k in ("task_id", "instruction", "evaluator"):
            if single[k] is None:
                raise BadRequest(k, "field required (or give tasks)")
        raw = [single]
    if not raw:
        raise BadRequest("tasks", "no tasks")
    for i, t in enumerate(raw):
        t["adapter"] = _harness(t.get("adapter"), f"tasks[{i}].adapter")
    tasks = [_entry({**t, "image": _image(t.get("image"), body.runtime)}, root) for t in raw]
    strategy = _strategy(body.trajectory_strategy)
    return Submission(tasks, body.group_size, _harness(body.harness, "harness"), body.min_groups,
                      body.max_staleness, body.sampling, body.callback_url, strategy,
                      {"runtime": body.runtime, "trajectory_strategy": strategy})


def _from_harbor(body: ShortTask, root: Path) -> Submission:
    """A Harbor folder under the tasks root, read here so a bad one is a 422 naming `harbor`."""
    from polar.tasks.load import load_tasks
    from polar.tasks.task import TaskError

    folder = (root / body.harbor).resolve()  # an absolute value stays itself
    if not inside(folder, (root,)):
        raise BadRequest("harbor", f"{body.harbor!r} is outside the service's tasks root {root}")
    if not folder.is_dir():
        raise BadRequest("harbor", f"{body.harbor!r}: no such folder under the tasks root {root}")
    try:
        specs = load_tasks(folder, [str(root)])
    except (TaskError, ValueError, OSError) as e:
        raise BadRequest("harbor", str(e)) from e
    strategy = _strategy(body.trajectory_strategy)
    return Submission([{"task_id": t.task_id} for t in specs], body.group_size, _harness(body.harness, "harness"),
                      body.min_groups, body.max_staleness, body.sampling, body.callback_url, strategy,
                      {"runtime": body.runtime, "trajectory_strategy": strategy, "harbor": str(folder)},
                      folder=folder)


def from_task_request(body: TaskRequest, root: Path) -> Submission:
    if body.agent.env:
        raise BadRequest("agent.env", "not supported: a harness's environment comes from its adapter "
                                      "(adapters/*.yaml)")
    if body.early_stop_min_usable_sessions is not None and body.early_stop_min_usable_sessions > body.num_samples:
        raise BadRequest("early_stop_min_usable_sessions", f"{body.early_stop_min_usable_sessions} is more than "
                                                           f"num_samples ({body.num_samples})")
    metadata = {**body.metadata, **({"model_name": body.agent.model_name} if body.agent.model_name else {})}
    task = _entry({"task_id": body.task_id, "instruction": body.instruction, "evaluator": body.evaluator,
                   "workspace": body.workspace, "image": _image(body.image, body.runtime), "tests": body.tests,
                   "timeout_s": body.timeout_seconds, "metadata": metadata or None, "submit": body.submit}, root)
    extra = {"runtime": body.runtime, "dispatch_priority": body.dispatch_priority,
             "early_stop_min_usable_sessions": body.early_stop_min_usable_sessions,
             "trajectory_strategy": _strategy(body.builder.strategy)}
    return Submission([task], body.num_samples, _harness(body.agent.harness, "agent.harness"),
                      callback_url=body.callback_url, strategy=_strategy(body.builder.strategy), extra=extra,
                      size_field="num_samples")
