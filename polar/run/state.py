"""A sample's state between its stages: `<out>/sample.json`, read and written whole by each stage (polar/run/sample.py).

One typed record instead of a loose dict, so a stage cannot misspell a key or put a status where a failure goes;
the file keeps the JSON shape the workers read (`session`) and the tests check (`instance`, `cleaned`); a file
written before a field existed reads with that field's default."""
from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Literal

from polar.run.services import SessionLogin
from polar.sandbox.runtime import Mounts
from polar.tasks.task import TaskSpec
from polar_mitm.launch import ProxyProcess
from polar_traj import atomic

STATE = "sample.json"

Status = Literal["completed", "timeout", "error"]  # polar_traj's vocabulary
Failure = Literal["agent_timeout", "infrastructure"]
Stage = Literal["prepare", "harness", "evaluator"]


@dataclass(frozen=True)
class Outcome:
    """How a sample ended when a stage decided it early (else the evaluator's reward decides)."""

    status: Status
    failure: Failure | None
    reason: str | None


@dataclass
class SampleState:
    sample_id: str
    group_id: str
    out: Path
    task: TaskSpec
    adapter: str
    adapter_source: str
    way_in: str  # https_proxy | base_url
    runtime: str  # as asked, then as resolved by prepare (apptainer | bwrap | local)
    engine: dict[str, Any]  # EngineConfig, for the record
    proxy: ProxyProcess
    shared: Path  # the socket folder shared with the sandbox
    shared_temporary: bool
    node: str
    started_at: float
    instance: str | None = None  # the sandbox's name, once it runs (an apptainer instance)
    session: SessionLogin | None = None
    harness: dict[str, Any] | None = None  # rendered argv and env
    outcome: Outcome | None = None
    exit_code: int | None = None
    timed_out: bool = False
    evaluation: dict[str, Any] | None = None  # polar.scoring.evaluate's result, or the crash
    verify_instance: str | None = None  # the verifier's own sandbox, once it runs
    tampered: list[str] = field(default_factory=list)  # polar.scoring.verify: what the agent did to the verifier
    suspicious: list[str] = field(default_factory=list)  # polar.scoring.suspicious and the observer's flags
    timings: dict[str, float] = field(default_factory=dict)
    cleaned: dict[str, bool] = field(default_factory=dict)  # session, sandbox: done by cleanup
    cleanup_errors: list[str] = field(default_factory=list)
    strategy: str = "prefix_merge"  # how postrun builds the trajectories (SampleConfig.strategy)
    disk_mb: int | None = None  # the disk quota in force (polar/sandbox/quota.py); None: none
    artifacts: list[str] = field(default_factory=list)  # the task's artifacts kept in <out>/artifacts
    # A multi-step task's steps as they run (polar/run/multistep.py): name, session, rendered harness (argv, env,
    # files), then exit_code, timed_out, evaluation, stopped (why the steps after it did not run)
    steps: list[dict[str, Any]] = field(default_factory=list)
    verifier_hosts: list[str] | None = None  # SampleConfig.verifier_hosts, for a task that asks for the internet

    @property
    def mounts(self) -> Mounts:
        return Mounts(self.out / "home", self.out / "workspace", self.shared, workdir=self.task.workdir)

    @property
    def verify_mounts(self) -> Mounts:
        root = self.out / "verify"
        return Mounts(root / "home", root / "workspace", root / "shared", workdir=self.task.workdir)

    def session_left(self) -> float:
        """Seconds left of the sample's session budget (at least 1)."""
        return max(1.0, self.task.session_timeout_s - (time.time() - self.started_at))

    def fail(self, stage: Stage, reason: str, failure: Failure = "infrastructure") -> None:
        """Record the first failure of the sample (later ones do not overwrite it)."""
        if self.outcome is None:
            self.outcome = Outcome("error", failure, f"{stage}: {reason}")

    def to_dict(self) -> dict[str, Any]:
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        data.update(out=str(self.out), task=self.task.to_dict(), shared=str(self.shared),
                    proxy=self.proxy.to_dict(),
                    session=asdict(self.session) if self.session else None,
                    outcome=asdict(self.outcome) if self.outcome else None)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SampleState:
        p, s, o = data["proxy"], data.get("session"), data.get("outcome")
        return cls(**{**data, "out": Path(data["out"]), "task": TaskSpec.from_dict(data["task"]),
                      "shared": Path(data["shared"]),
                      "proxy": ProxyProcess.from_dict(p),
                      "session": SessionLogin(**s) if s else None, "outcome": Outcome(**o) if o else None})

    def save(self) -> None:
        atomic.write_text(self.out / STATE, json.dumps(self.to_dict(), indent=2))


def load_state(out: Path) -> SampleState:
    return SampleState.from_dict(json.loads((Path(out) / STATE).read_text()))
