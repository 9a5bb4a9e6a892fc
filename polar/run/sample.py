"""One scored sample: a task's workspace in a sandbox, a harness working on it through the proxy, the task's
evaluator in the same sandbox, and the sample's trajectories with reward, status and weight (docs/tasks.md).

Four stages, each a public function whose state lives in `<out>/sample.json`, so each may run in another process
of the same node (the Celery workers do that); `run_sample` runs the four in a row:
  prepare_sample(cfg, engine, proxy) -> out   workspace copied, sandbox started, session registered, harness
                                              files rendered
  run_harness(out)                            the harness, behind socket bridges to the proxy
  evaluate_sample(out)                        the evaluator (skipped after a failure or an agent timeout)
  postrun_sample(out) -> SampleResult         trajectories.parquet (atomic), session unregistered, sandbox
                                              stopped, result.json
None raises for a harness, sandbox or evaluator failure: that becomes status/failure/reason (polar_traj's
vocabulary: status completed|timeout|error, failure agent_timeout|infrastructure, weight 0 for infrastructure).
"""
from __future__ import annotations

import json
import shutil
import signal
import socket
import tarfile
import time
import uuid
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterator

from polar.harness.adapters import AdapterSpec
from polar.run.session import (DEFAULT_CONFDIR, HARNESS_BIN, TOOLS_BIN, EngineConfig, HarnessSetup, capture_files,
                          changed_since_start, exec_harness, render_harness, shared_dir,
                          start_services, write_ca)
from polar.sandbox.runtime import Mounts, Sandbox, get_runtime, resolve_runtime
from polar.run.services import ProxyHandle, Session, new_session
from polar.tasks.spec import TaskSpec

STATE = "sample.json"
RESULT = "result.json"
SERVICES = "services"  # run_sample's own engine and proxy, when it starts them


@dataclass(frozen=True)
class SampleConfig:
    task: TaskSpec
    adapter: AdapterSpec
    out: Path  # the sample's own fresh folder
    sample_id: str
    group_id: str
    runtime: str = "auto"  # auto | apptainer | bwrap | local
    way_in: str = "https_proxy"  # https_proxy | base_url
    model: str | None = None  # model name the harness asks for; default: the adapter's
    confdir: Path = DEFAULT_CONFDIR  # CA dir of a proxy started by run_sample
    tools_bin: tuple[Path, ...] = (TOOLS_BIN, HARNESS_BIN)  # as polar run; Apptainer binds only .tools/npm


@dataclass
class SampleResult:
    sample_id: str
    task_id: str
    group_id: str
    adapter: str
    status: str  # completed | timeout | error
    failure: str | None  # None | agent_timeout | infrastructure
    reason: str | None
    reward: float | None
    weight: float
    exit_code: int | None
    evaluator_output: str
    timings: dict[str, float]  # prepare_s, run_s, evaluate_s, postrun_s
    trajectories: str | None  # this sample's Parquet file (rows carry reward/status/weight/metadata)
    capture_files: list[str]
    node: str
    runtime: str = ""
    calls: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SampleResult:
        return cls(**data)


# -- state file ---------------------------------------------------------------------------------------------------
def _write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=2))
    tmp.replace(path)


def _load(out: Path) -> dict[str, Any]:
    return json.loads((Path(out) / STATE).read_text())


def _fail(state: dict[str, Any], reason: str, failure: str = "infrastructure") -> None:
    """Record the first failure of the sample (later ones do not overwrite it)."""
    if state.get("outcome") is None:
        state["outcome"] = {"status": "error", "failure": failure, "reason": reason}


def _mounts(state: dict[str, Any]) -> Mounts:
    out = Path(state["out"])
    return Mounts(out / "home", out / "workspace", Path(state["shared"]))


def _sandbox(state: dict[str, Any]) -> Sandbox:
    """The sample's sandbox again: the running apptainer instance, or a fresh host-filesystem sandbox."""
    runtime = get_runtime(state["runtime"])
    if state["runtime"] == "apptainer":
        return runtime.attach(_mounts(state), state["task"]["image"], state["instance"])
    return runtime.prepare(_mounts(state))


def _proxy(state: dict[str, Any]) -> ProxyHandle:
    p = state["proxy"]
    return ProxyHandle(p["host"], p["proxy_port"], p["base_url_port"], Path(p["ca_cert"]), Path(p["capture_dir"]),
                       p["sessions"])


# -- stages -------------------------------------------------------------------------------------------------------
def prepare_sample(cfg: SampleConfig, engine: EngineConfig, proxy: ProxyHandle) -> Path:
    """Fresh folder, workspace, sandbox, registered session and rendered harness files; writes sample.json.
    Raises ValueError only for a caller's mistake (a used folder, an adapter without this way in)."""
    from polar_traj.records import check_id

    check_id(cfg.sample_id, "sample_id")
    check_id(cfg.group_id, "group_id")
    if not cfg.adapter.supports(cfg.way_in):
        raise ValueError(f"adapter {cfg.adapter.name} does not support the {cfg.way_in} way in")
    out = cfg.out.resolve()
    if out.exists() and set(p.name for p in out.iterdir()) - {SERVICES}:
        raise ValueError(f"sample folder {out} exists and is not empty: each sample gets a fresh one")
    for d in ("home", "workspace", "logs"):
        (out / d).mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    shared, temporary = shared_dir(out)
    state: dict[str, Any] = {
        "sample_id": cfg.sample_id, "group_id": cfg.group_id, "out": str(out), "task": cfg.task.to_dict(),
        "adapter": cfg.adapter.name, "adapter_source": cfg.adapter.source, "way_in": cfg.way_in,
        "runtime": cfg.runtime, "engine": {**asdict(engine), "model_dir": str(engine.model_dir),
                                           "policy": str(engine.policy) if engine.policy else None},
        "proxy": {**asdict(proxy), "ca_cert": str(proxy.ca_cert), "capture_dir": str(proxy.capture_dir)},
        "shared": str(shared), "shared_temporary": temporary, "instance": None, "session": None,
        "harness": None, "outcome": None, "exit_code": None, "timed_out": False, "evaluation": None,
        "node": socket.gethostname(), "timings": {}, "started_at": time.time(),
    }
    try:
        _prepare(cfg, proxy, state)
    except Exception as e:  # noqa: BLE001 - any failure here is the sample's infrastructure failing
        _fail(state, f"prepare: {type(e).__name__}: {e}")
    state["timings"]["prepare_s"] = round(time.monotonic() - start, 3)
    _write_json(out / STATE, state)
    return out


def _prepare(cfg: SampleConfig, proxy: ProxyHandle, state: dict[str, Any]) -> None:
    task = cfg.task
    state["runtime"] = resolve_runtime(cfg.runtime, task.image)
    mounts = _mounts(state)
    runtime = get_runtime(state["runtime"])
    if state["runtime"] == "apptainer":
        sandbox = runtime.prepare(mounts, image=task.image, instance=f"polar-{cfg.sample_id[:40]}-{uuid.uuid4().hex[:6]}")
        state["instance"] = sandbox.name
        _write_json(Path(state["out"]) / STATE, state)  # the instance is stopped by postrun even if we die now
    else:
        sandbox = runtime.prepare(mounts)
    if task.workspace is not None:
        _copy_workspace(sandbox, task.workspace, mounts.workspace)
    session = new_session(proxy, task.task_id, cfg.sample_id)
    state["session"] = asdict(session)
    setup = HarnessSetup(cfg.adapter, task.instruction, cfg.model or cfg.adapter.model, cfg.way_in,
                         state["runtime"], cfg.tools_bin)
    rendered = render_harness(setup, mounts, session, write_ca(proxy, mounts.shared), Path(state["out"]))
    state["harness"] = {"argv": list(rendered.argv), "env": rendered.env}


def _copy_workspace(sandbox: Sandbox, src: Path, dst: Path) -> None:
    if src.is_dir():
        sandbox.copy_in(src, dst)
        return
    with tarfile.open(src, "r:gz") as tar:
        tar.extractall(dst, filter="data")


def run_harness(sample_dir: Path) -> None:
    """The harness in the sample's sandbox, within the task's budget (less when the session budget is shorter)."""
    out = Path(sample_dir)
    state = _load(out)
    start = time.monotonic()
    if state["outcome"] is None:
        task = state["task"]
        budget = min(task["timeout_s"], _session_left(state))
        try:
            result = exec_harness(_sandbox(state), state["harness"]["argv"], state["harness"]["env"],
                                  _mounts(state), _proxy(state), budget, out)
            state["exit_code"], state["timed_out"] = result.exit_code, result.timed_out
        except Exception as e:  # noqa: BLE001
            _fail(state, f"harness: {type(e).__name__}: {e}")
    state["timings"]["run_s"] = round(time.monotonic() - start, 3)
    _write_json(out / STATE, state)


def _session_left(state: dict[str, Any]) -> float:
    return max(1.0, state["task"]["session_timeout_s"] - (time.time() - state["started_at"]))


def evaluate_sample(sample_dir: Path) -> None:
    """The task's evaluator in the same sandbox; a crash is an infrastructure failure, not a reward."""
    from polar.tasks.evaluate import EvaluatorCrash, evaluate
    from polar.tasks.spec import EvaluatorSpec

    out = Path(sample_dir)
    state = _load(out)
    start = time.monotonic()
    if state["outcome"] is None and not state["timed_out"]:
        spec = EvaluatorSpec.from_dict(state["task"]["evaluator"])
        summary = {k: state[k] for k in ("sample_id", "group_id", "adapter", "exit_code", "timed_out")}
        summary["task_id"] = state["task"]["task_id"]
        summary["files_changed"] = changed_since_start(out)
        try:
            result = evaluate(spec, _sandbox(state), _mounts(state), out, summary,
                              min(spec.timeout_s, _session_left(state)))
            state["evaluation"] = asdict(result)
        except EvaluatorCrash as e:
            state["evaluation"] = {"reward": None, "output": e.output, "detail": str(e)}
            _fail(state, f"evaluator: {e}")
    state["timings"]["evaluate_s"] = round(time.monotonic() - start, 3)
    _write_json(out / STATE, state)


def postrun_sample(sample_dir: Path) -> SampleResult:
    """Trajectories with the outcome, the session ended, the sandbox stopped; result.json. Idempotent cleanup."""
    out = Path(sample_dir)
    start = time.monotonic()
    cleanup_sample(out)
    state = _load(out)
    files = _captures(state)
    status, failure, reason, reward = _outcome(state, files)
    entry = {"session_id": state["sample_id"], "status": status, "failure": failure, "reason": reason,
             "reward": reward, "group_id": state["group_id"], "harness": state["adapter"],
             "metadata": {**state["task"]["metadata"], "sample_id": state["sample_id"],
                          "task_id": state["task"]["task_id"], "exit_code": state["exit_code"],
                          "runtime": state["runtime"]}}
    parquet, build_error = _build(out, files, entry)
    if build_error and failure is None:
        status, failure, reason = "error", "infrastructure", build_error
    elif build_error:  # the outcome stands; say why its rows are missing
        reason = f"{reason}; {build_error}"
    from polar_traj.outcomes import parse_entry, resolve

    resolved = resolve(parse_entry({k: v for k, v in entry.items() if k != "metadata"} | {
        "status": status, "failure": failure}))
    state["timings"]["postrun_s"] = round(time.monotonic() - start, 3)
    evaluation = state.get("evaluation") or {}
    result = SampleResult(
        state["sample_id"], state["task"]["task_id"], state["group_id"], state["adapter"], resolved.status,
        resolved.failure, reason, resolved.reward, 1.0 if resolved.trainable else 0.0, state["exit_code"],
        evaluation.get("output", ""), state["timings"], str(parquet) if parquet else None,
        [str(f) for f in files], state["node"], state["runtime"], _count_calls(files))
    _write_json(out / STATE, state)
    _write_json(out / RESULT, result.to_dict())
    return result


def cleanup_sample(sample_dir: Path) -> None:
    """End the session and stop the sandbox; safe to call more than once and on any stage's failure."""
    out = Path(sample_dir)
    state = _load(out)
    done = state.setdefault("cleaned", {})
    session, sessions = state.get("session"), state["proxy"]["sessions"]
    if session and sessions != "open" and not done.get("session"):
        try:
            from polar_mitm.sessions import unregister_session

            unregister_session(sessions, session["token"])
        except Exception as e:  # noqa: BLE001
            state.setdefault("cleanup_errors", []).append(f"unregister session: {e}")
        done["session"] = True
    if state.get("instance") and not done.get("sandbox"):
        try:
            _sandbox(state).stop()
        except Exception as e:  # noqa: BLE001
            state.setdefault("cleanup_errors", []).append(f"stop sandbox: {e}")
        done["sandbox"] = True
    if state.get("shared_temporary"):
        shutil.rmtree(state["shared"], ignore_errors=True)
    _write_json(out / STATE, state)


def _outcome(state: dict[str, Any], files: list[Path]) -> tuple[str, str | None, str | None, float | None]:
    if state["outcome"] is not None:
        o = state["outcome"]
        return o["status"], o["failure"], o["reason"], None
    if state["timed_out"]:
        return "timeout", "agent_timeout", f"the agent ran past its {state['task']['timeout_s']:g}s budget", 0.0
    unreachable = _engine_unreachable(files)
    if unreachable:
        return "error", "infrastructure", unreachable, None
    return "completed", None, None, (state.get("evaluation") or {}).get("reward")


def _engine_unreachable(files: list[Path]) -> str | None:
    """A reason when every call the harness made failed (the engine was unreachable or refused them all)."""
    from polar_traj.capture_reader import read_capture

    errors = [r.error for f in files for r in read_capture(f)]
    if errors and all(e is not None for e in errors):
        return f"every LLM call failed ({len(errors)}): {str(errors[-1])[:300]}"
    return None


def _captures(state: dict[str, Any]) -> list[Path]:
    session = state.get("session")
    if not session:
        return []
    out = Path(state["out"])
    proxy = _proxy(state)
    s = Session(session["task_id"], session["session_id"], session["token"])
    return capture_files(proxy, False, s, out)


def _build(out: Path, files: list[Path], entry: dict[str, Any]) -> tuple[Path | None, str | None]:
    if not files:
        return None, None
    from polar_traj.build import BuildConfig
    from polar_traj.outcomes import parse_outcomes
    from polar_traj.pipeline import Selection, build_parquet

    target = out / "trajectories.parquet"
    task_id, session_id = files[0].parent.name, files[0].stem
    try:
        build_parquet(Selection(files[0].parents[1], task_id, session_id), target,
                      BuildConfig(strategy="prefix_merge"), parse_outcomes([entry]))
    except (OSError, ValueError) as e:
        return None, f"trajectories not built: {e}"
    return target, None


def _count_calls(files: list[Path]) -> int:
    return sum(1 for f in files for line in f.read_text().splitlines() if line.strip())


# -- all four in a row --------------------------------------------------------------------------------------------
def run_sample(cfg: SampleConfig, engine: EngineConfig, proxy: ProxyHandle | None = None) -> SampleResult:
    """prepare, run, evaluate, postrun; starts the engine and a proxy for this sample when `proxy` is None.
    The sandbox is stopped and the session ended on every way out, SIGTERM included."""
    out = cfg.out.resolve()
    with ExitStack() as stack, _term_as_exit():
        if proxy is None:
            services = out / SERVICES  # engine, proxy, their logs and captures
            (services / "logs").mkdir(parents=True)
            proxy = stack.enter_context(start_services(services, engine, cfg.confdir, stack,
                                                       sessions=_private_sessions(services, stack)))
        prepare_sample(cfg, engine, proxy)
        try:
            run_harness(out)
            evaluate_sample(out)
        finally:
            cleanup_sample(out)
        return postrun_sample(out)


@contextmanager
def _term_as_exit() -> Iterator[None]:
    """SIGTERM unwinds like Ctrl-C (so finally blocks stop the sandbox), in the main thread only."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    old = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def _private_sessions(folder: Path, stack: ExitStack) -> str:
    """A private redis-server on a unix socket for this sample's proxy, so that the session carries its task id
    (open mode names every session's task `local`); open mode when redis-server is not installed."""
    from polar.run.local_redis import private_redis

    if not shutil.which("redis-server"):
        return "open"
    return stack.enter_context(private_redis(folder))
