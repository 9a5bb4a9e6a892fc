"""What one scored sample is about: the task and its evaluator as plain values. Task files are read by
polar/tasks/load.py (YAML, JSONL) and polar/tasks/harbor.py (Harbor task directories); both build these."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Callable, Mapping

from polar.sandbox.limits import DEFAULT_LIMITS, Limits

DEFAULT_TIMEOUT_S = 600.0
DEFAULT_EVAL_TIMEOUT_S = 120.0
SESSION_MARGIN_S = 120.0  # default session budget beyond the agent's and the evaluator's
DEFAULT_REWARD_RANGE = (0.0, 1.0)
HEALTHCHECK_TIMEOUT_S = 60.0  # a task's healthcheck, run before the agent starts
DEFAULT_MAX_CALLS = 400  # LLM calls one session may make (harness and anything the agent runs, together)
TESTS_AT, LOGS_AT, SOLUTION_AT = "/tests", "/logs", "/solution"  # where a Harbor task's scripts look for them


class TaskError(ValueError):
    """A malformed task file; the message is "FILE:LINE: FIELD: problem"."""


@dataclass(frozen=True)
class Submit:
    """What the agent's work may contribute to verification (polar/scoring/allow.py, docs/tasks.md "submit").
    Every other change it made is dropped before the verifier runs, and named in `tampered`."""

    globs: tuple[str, ...] = ()  # workspace globs (the syntax of `protected`) the agent may add, change, delete
    existing: bool = False  # also every file the task's pristine workspace already holds (change or delete)
    binary: bool = False  # compiled or binary files (.so, .pyc, ELF, NUL bytes) may come in where globs or existing
    new: bool = False  # also new regular text files anywhere, but never pytest's configuration, start-up hooks,
    #                    compiled files or a module named like the standard library's
    executable: tuple[str, ...] = ()  # globs of files the agent may make executable (a new file keeps its mode)
    source: str = "task"  # who wrote this allowlist: task (its file) | oracle (its solution's changes) | default

    def to_dict(self) -> dict[str, Any]:
        """A task file's `submit` mapping (SUBMIT_KEYS), and who wrote it when that is not the task."""
        data = {"files": list(self.globs), "existing": self.existing, "binary": self.binary, "new": self.new,
                "executable": list(self.executable)}
        return data if self.source == "task" else {**data, "source": self.source}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> Submit | None:
        if data is None:
            return None
        return cls(tuple(data.get("files") or ()), bool(data.get("existing")), bool(data.get("binary")),
                   bool(data.get("new")), tuple(data.get("executable") or ()), data.get("source") or "task")


# A task without `submit:` and without an oracle to learn from: change or delete the files it has, add new text files.
DEFAULT_SUBMIT = Submit(existing=True, new=True, source="default")
SUBMIT_KEYS = ("files", "existing", "binary", "new", "executable")
Fail = Callable[[str, str], Exception]  # (key, problem) -> the loader's error, naming its file and line


def parse_globs(value: Any, key: str, fail: Fail) -> tuple[str, ...]:
    """Workspace globs (relative, inside the workspace); None: none."""
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(g, str) and g.strip() for g in value):
        raise fail(key, f"expected a list of workspace globs, got {value!r}")
    bad = [g for g in value if g.startswith("/") or ".." in Path(g).parts]
    if bad:
        raise fail(key, f"{bad[0]!r}: globs are relative to the workspace, inside it")
    return tuple(value)


def parse_submit(value: Any, key: str, fail: Fail, list_existing: bool) -> Submit | None:
    """A task file's `submit`: a list of globs (`list_existing`: the workspace's own files too, as Harbor and SWE
    read it) or a mapping of SUBMIT_KEYS; absent: None (the oracle's changes, else DEFAULT_SUBMIT)."""
    if value is None:
        return None
    if isinstance(value, list):
        return Submit(parse_globs(value, key, fail), existing=list_existing)
    if not isinstance(value, dict):
        raise fail(key, f"expected a list of workspace globs or a mapping, got {value!r}")
    unknown = sorted(set(map(str, value)) - set(SUBMIT_KEYS))
    if unknown:
        raise fail(f"{key}.{unknown[0]}", f"unknown (known: {', '.join(SUBMIT_KEYS)})")
    flags = {k: value.get(k, list_existing if k == "existing" else False) for k in ("existing", "binary", "new")}
    for k, v in flags.items():
        if not isinstance(v, bool):
            raise fail(f"{key}.{k}", f"expected true or false, got {v!r}")
    return Submit(parse_globs(value.get("files"), f"{key}.files", fail), flags["existing"], flags["binary"],
                  flags["new"], parse_globs(value.get("executable"), f"{key}.executable", fail))


@dataclass(frozen=True)
class EvaluatorSpec:
    """How a finished sample is scored (polar/scoring/evaluate.py)."""

    kind: str  # command | files | python | pytest | harbor (a Harbor task's tests/test.sh, polar/tasks/harbor.py)
    command: str | None = None  # kind command: a shell line, run in the sandbox's workspace
    reward: str = "exit"  # kind command: exit (1.0 for exit 0 else 0.0) | stdout (last line) | file
    reward_file: str = "reward.txt"  # kind command, reward file: relative to the workspace
    files: Mapping[str, str | None] = field(default_factory=lambda: MappingProxyType({}))  # path -> text|None
    python: str | None = None  # kind python: module:function(workspace: Path, summary: dict) -> float|dict
    timeout_s: float = DEFAULT_EVAL_TIMEOUT_S
    pytest: tuple[str, ...] = ()  # kind pytest: the task's test files, relative to `tests:` (polar/scoring/observer.py)
    env: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))  # the verifier's own variables

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "command": self.command, "reward": self.reward, "reward_file": self.reward_file,
                "files": dict(self.files), "python": self.python, "timeout_s": self.timeout_s,
                "pytest": list(self.pytest), "env": dict(self.env)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> EvaluatorSpec:
        return cls(**{**data, "files": MappingProxyType(dict(data.get("files") or {})),
                      "pytest": tuple(data.get("pytest") or ()), "env": MappingProxyType(dict(data.get("env") or {}))})


STEP_STRATEGIES = ("mean", "final")  # a multi-step task's reward: Harbor's multi_step_reward_strategy
SETUP_SCRIPT = "setup.sh"  # a step's workdir/setup.sh: Harbor's setup hook, run before the step, never copied in


@dataclass(frozen=True)
class StepSpec:
    """One step of a multi-step Harbor task (polar/tasks/steps.py): its own instruction, agent budget, files and
    setup hook, tests over the task's, and a reward floor below which the steps after it do not run."""

    name: str
    instruction: str
    timeout_s: float  # the agent's budget for this step
    verify_timeout_s: float
    verifier_env: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    files: Path | None = None  # steps/<name>/workdir/: copied into the workspace before the step (not setup.sh)
    setup: str | None = None  # workdir/setup.sh's text: run in the agent's sandbox, in the workdir, before it
    tests: Path | None = None  # steps/<name>/tests/: staged over the task's tests/ for this step's verifier
    solution: Path | None = None  # steps/<name>/solution/solve.sh, for --oracle
    min_reward: float | Mapping[str, float] | None = None  # a floor on the reward, or on named rewards
    healthcheck: str | None = None  # run before this step's agent, as the task's healthcheck
    healthcheck_timeout_s: float = HEALTHCHECK_TIMEOUT_S

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "instruction": self.instruction, "timeout_s": self.timeout_s,
                "verify_timeout_s": self.verify_timeout_s, "verifier_env": dict(self.verifier_env),
                "files": str(self.files) if self.files else None, "setup": self.setup,
                "tests": str(self.tests) if self.tests else None,
                "solution": str(self.solution) if self.solution else None,
                "min_reward": dict(self.min_reward) if isinstance(self.min_reward, Mapping) else self.min_reward,
                "healthcheck": self.healthcheck, "healthcheck_timeout_s": self.healthcheck_timeout_s}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> StepSpec:
        path = lambda key: Path(data[key]) if data.get(key) else None  # noqa: E731
        floor = data.get("min_reward")
        return cls(data["name"], data["instruction"], float(data["timeout_s"]), float(data["verify_timeout_s"]),
                   MappingProxyType(dict(data.get("verifier_env") or {})), path("files"), data.get("setup"),
                   path("tests"), path("solution"), MappingProxyType(dict(floor)) if isinstance(floor, dict) else floor,
                   data.get("healthcheck"), float(data.get("healthcheck_timeout_s") or HEALTHCHECK_TIMEOUT_S))


@dataclass(frozen=True)
class TaskSpec:
    task_id: str
    instruction: str
    workspace: Path | None
    image: str  # SIF path, sandbox directory, OCI reference or tarball, or "host"
    adapter: str | None
    evaluator: EvaluatorSpec
    timeout_s: float = DEFAULT_TIMEOUT_S
    session_timeout_s: float = DEFAULT_TIMEOUT_S + DEFAULT_EVAL_TIMEOUT_S + SESSION_MARGIN_S
    metadata: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    tests: Path | None = None  # task-owned verification files, staged after the run (the agent never sees them)
    protected: tuple[str, ...] = ()  # workspace globs the agent must not change (restored, flagged as tampered)
    reward_range: tuple[float, float] = DEFAULT_REWARD_RANGE
    max_calls: int = DEFAULT_MAX_CALLS
    memory_mb: int | None = None  # a Harbor task's [environment] resources; None: the node's sandbox limits
    cpus: float | None = None
    submit: Submit | None = None  # what the agent's work may contribute; None: the oracle's changes, else DEFAULT_SUBMIT
    # Where the sandbox sees the workspace (a Harbor task's workdir, `/app`); None: at its host path. For a task
    # whose image holds files there, polar/sandbox/image_files.py seeds the workspace from them.
    workdir: str | None = None
    env: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))  # the agent's sandbox variables
    storage_mb: int | None = None  # the agent's writable folders' quota (polar/sandbox/quota.py); None: the node's
    wants_internet: bool = False  # its verifier gets the egress proxy (polar/sandbox/egress.py); the agent never
    healthcheck: str | None = None  # a shell line that must pass in the agent's sandbox before the agent starts
    healthcheck_timeout_s: float = HEALTHCHECK_TIMEOUT_S
    # (workspace path, name under artifacts/): copied into the sample folder after the run (polar/run/artifacts.py)
    artifacts: tuple[tuple[str, str], ...] = ()
    steps: tuple[StepSpec, ...] = ()  # a multi-step task's steps, in order (polar/tasks/steps.py); () for one step
    step_reward: str = "mean"  # a multi-step task's reward from its steps' (STEP_STRATEGIES)
    solution: Path | None = None  # a Harbor task's solution/solve.sh: its oracle (polar/scoring/oracle.py)
    gpus: int = 0  # GPUs the task asks for (Harbor's [environment] gpus); a node with fewer refuses it

    @property
    def allowed(self) -> Submit:
        return self.submit or DEFAULT_SUBMIT

    @property
    def has_oracle(self) -> bool:
        """The task set ships an honest solution: a Harbor solve.sh (each step's, for a multi-step task), an SWE gold
        patch or a `metadata.fix` command."""
        swe, fix = self.metadata.get("swe"), self.metadata.get("fix")
        return (self.solution is not None or any(s.solution for s in self.steps)
                or (isinstance(swe, Mapping) and bool(swe.get("patch"))) or (isinstance(fix, str) and bool(fix.strip())))

    def sandbox_limits(self) -> Limits:
        """The limits of this task's sandboxes: the node's defaults, with the task's memory and CPUs."""
        memory = DEFAULT_LIMITS.memory_bytes if self.memory_mb is None else self.memory_mb << 20
        return dataclasses.replace(DEFAULT_LIMITS, memory_bytes=memory, cpus=self.cpus)

    def to_dict(self) -> dict[str, Any]:
        return {"task_id": self.task_id, "instruction": self.instruction,
                "workspace": str(self.workspace) if self.workspace else None, "image": self.image,
                "adapter": self.adapter, "evaluator": self.evaluator.to_dict(), "timeout_s": self.timeout_s,
                "session_timeout_s": self.session_timeout_s, "metadata": dict(self.metadata),
                "tests": str(self.tests) if self.tests else None, "protected": list(self.protected),
                "reward_range": list(self.reward_range), "max_calls": self.max_calls, "memory_mb": self.memory_mb,
                "cpus": self.cpus, "submit": self.submit.to_dict() if self.submit else None, "workdir": self.workdir,
                "env": dict(self.env), "storage_mb": self.storage_mb, "wants_internet": self.wants_internet,
                "healthcheck": self.healthcheck, "healthcheck_timeout_s": self.healthcheck_timeout_s,
                "artifacts": [list(a) for a in self.artifacts], "steps": [step.to_dict() for step in self.steps],
                "step_reward": self.step_reward, "solution": str(self.solution) if self.solution else None,
                "gpus": self.gpus}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TaskSpec:
        return cls(data["task_id"], data["instruction"], Path(data["workspace"]) if data.get("workspace") else None,
                   data["image"], data.get("adapter"), EvaluatorSpec.from_dict(data["evaluator"]),
                   float(data["timeout_s"]), float(data["session_timeout_s"]),
                   MappingProxyType(dict(data.get("metadata") or {})),
                   Path(data["tests"]) if data.get("tests") else None, tuple(data.get("protected") or ()),
                   tuple(data.get("reward_range") or DEFAULT_REWARD_RANGE),  # type: ignore[arg-type]
                   int(data.get("max_calls") or DEFAULT_MAX_CALLS), data.get("memory_mb"), data.get("cpus"),
                   Submit.from_dict(data.get("submit")), data.get("workdir"),
                   MappingProxyType(dict(data.get("env") or {})), data.get("storage_mb"),
                   bool(data.get("wants_internet")), data.get("healthcheck"),
                   float(data.get("healthcheck_timeout_s") or HEALTHCHECK_TIMEOUT_S),
                   tuple((a, a) if isinstance(a, str) else (a[0], a[1]) for a in data.get("artifacts") or ()),
                   tuple(StepSpec.from_dict(step) for step in data.get("steps") or ()),
                   data.get("step_reward") or "mean", Path(data["solution"]) if data.get("solution") else None,
                   int(data.get("gpus") or 0))
