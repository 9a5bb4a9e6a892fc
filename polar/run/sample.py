"""One scored sample: a task's workspace in a sandbox, a harness working on it through the proxy, the task's
evaluator in a fresh sandbox where the agent never was, and the sample's trajectories with reward, status and
weight (docs/tasks.md).

Four stages, each a public function whose state lives in `<out>/sample.json`, so each may run in another process
of the same node (the Celery workers do that); `run_sample` runs the four in a row:
  prepare_sample(cfg, engine, proxy) -> out   workspace copied, sandbox started, session registered, harness
                                              files rendered
  run_harness(out)                            the harness, behind socket bridges to the proxy
  evaluate_sample(out)                        the agent's sandbox stopped, then the evaluator on a copy of the
                                              final workspace with the task's tests (skipped after a failure
                                              or an agent timeout), once it was seen to produce a reward on
                                              the untouched workspace (polar/scoring/precheck.py)
  postrun_sample(out) -> SampleResult         trajectories.parquet (atomic), session unregistered, sandbox
                                              stopped, result.json
None raises for a harness, sandbox or evaluator failure: that becomes status/failure/reason (polar_traj's
vocabulary: status completed|timeout|error, failure agent_timeout|infrastructure, weight 0 for infrastructure).
"""
from __future__ import annotations

import dataclasses
import json
import resource
import shutil
import signal
import socket
import threading
import time
import uuid
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterator

from polar.harness.adapters import AdapterSpec
from polar.run.local_redis import private_redis
from polar.run.preflight import gpu_shortfall
from polar.run.multistep import finish_steps, prepare_steps, run_steps, step_results, step_sessions
from polar.run.services import SessionLogin, new_session
from polar.run.session import (DEFAULT_CONFDIR, HARNESS_BIN, TOOLS_BIN, EngineConfig, HarnessSetup, capture_files,
                               exec_harness, prepare_harness, shared_dir, snapshot_workspace, start_services,
                               with_task_vars, workspace_snapshots)
from polar.run.summary import CONTENT_FAILURE, WorkspaceTooLarge, build_trajectories, changed_files, count_calls
from polar.run.state import SampleState, load_state
from polar.sandbox import quota, supervisor
from polar.sandbox.egress import verifier_egress
from polar.sandbox.occupancy import occupying
from polar.sandbox.runtime import Mounts, Sandbox, SandboxError, get_runtime, resolve_runtime
from polar.run.artifacts import keep_artifacts
from polar.scoring.evaluate import Evaluation, EvaluatorCrash, evaluate
from polar.scoring.evaluation import script_failure
from polar.scoring.oracle import oracle_allowlist
from polar.tasks.image_task import resolve_image_task
from polar.scoring.precheck import check_verifier
from polar.tasks.task import TaskSpec
from polar.scoring.verify import prepare_verify
from polar_mitm.launch import ProxyProcess
from polar_traj import atomic
from polar_traj.capture_reader import read_capture
from polar_traj.records import check_id

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
    # fixed for every LLM call (polar_mitm/sessions/sampling.py); None: the request's
    sampling: dict[str, Any] | None = None
    strategy: str = "prefix_merge"  # trajectories: prefix_merge | per_request (polar_traj.build)
    # The hosts the verify stage of a task that asks for the internet may reach (polar/sandbox/egress.py);
    # None: it runs offline, like every agent stage
    verifier_hosts: tuple[str, ...] | None = None


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
    timings: dict[str, float]  # <stage>_s wall and <stage>_cpu_s host CPU, stage: prepare, run, evaluate, postrun
    trajectories: str | None  # this sample's Parquet file (rows carry reward/status/weight/metadata)
    capture_files: list[str]
    node: str
    runtime: str = ""
    calls: int = 0
    tampered: list[str] = field(default_factory=list)  # agent changes dropped by the allowlist, HOME start-up hooks
    suspicious: list[str] = field(default_factory=list)  # "PATH: WHAT": changes reaching for the verifier, flags
    steps: list[dict[str, Any]] = field(default_factory=list)  # a multi-step task's: name, reward, ran, stopped
    notes: list[str] = field(default_factory=list)  # the first dropped changes: why, and the task line admitting one

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SampleResult:
        return cls(**data)


def _sandbox(state: SampleState) -> Sandbox:
    """The sample's sandbox again: its running instance, or a fresh one over the same folders."""
    return get_runtime(state.runtime, limits=state.task.sandbox_limits()).attach(state.mounts, state.task.image,
                                                                                  state.instance)


# -- stages -------------------------------------------------------------------------------------------------------
def prepare_sample(cfg: SampleConfig, engine: EngineConfig, proxy: ProxyProcess) -> Path:
    """Fresh folder, workspace, sandbox, registered session and rendered harness files; writes sample.json.
    Raises ValueError only for a caller's mistake (a used folder, an adapter without this way in)."""
    check_id(cfg.sample_id, "sample_id")
    check_id(cfg.group_id, "group_id")
    if not cfg.adapter.supports(cfg.way_in):
        raise ValueError(f"adapter {cfg.adapter.name} does not support the {cfg.way_in} way in")
    out = cfg.out.resolve()
    if out.exists() and set(p.name for p in out.iterdir()) - {SERVICES}:
        raise ValueError(f"sample folder {out} exists and is not empty: each sample gets a fresh one")
    for d in ("home", "workspace", "logs"):
        (out / d).mkdir(parents=True, exist_ok=True)
    start, cpu = time.monotonic(), host_cpu_s()
    shared, temporary = shared_dir(out)
    if temporary:  # outside the sample folder: removed by cleanup_sample, or by the watchdog of a killed run
        supervisor.watch_path(shared, f"path:{shared}")
    engine_record = {**asdict(engine), "model_dir": str(engine.model_dir),
                     "policy": str(engine.policy) if engine.policy else None}
    state = SampleState(cfg.sample_id, cfg.group_id, out, cfg.task, cfg.adapter.name, cfg.adapter.source,
                        cfg.way_in, cfg.runtime, engine_record, proxy, shared, temporary, socket.gethostname(),
                        time.time(), strategy=cfg.strategy,
                        verifier_hosts=list(cfg.verifier_hosts) if cfg.task.wants_internet and
                        cfg.verifier_hosts is not None else None)
    try:
        _prepare(cfg, proxy, state)
    except Exception as e:  # noqa: BLE001 - any failure here is the sample's infrastructure failing
        state.fail("prepare", f"{type(e).__name__}: {e}")
    _timed(state, "prepare", start, cpu)
    state.save()
    return out


def _prepare(cfg: SampleConfig, proxy: ProxyProcess, state: SampleState) -> None:
    if (short := gpu_shortfall(cfg.task)) is not None:  # the node's lack, never the agent's
        raise SandboxError(f"task {cfg.task.task_id} needs {short}")
    state.runtime = resolve_runtime(cfg.runtime, cfg.task.image)
    state.task = task = resolve_image_task(cfg.task, state.runtime)  # the image's workdir, files and variables
    _agent_disk(state)
    mounts = state.mounts
    sandbox = get_runtime(state.runtime, limits=task.sandbox_limits()).prepare(
        mounts, image=task.image, instance=f"polar-{cfg.sample_id[:40]}-{uuid.uuid4().hex[:6]}")
    state.instance = sandbox.name
    if state.instance:
        state.save()  # the instance is stopped by postrun even if we die now
    setup = HarnessSetup(cfg.adapter, task.instruction, cfg.model or cfg.adapter.model, cfg.way_in,
                         state.runtime, cfg.tools_bin)
    if task.steps:  # each step its own session and harness (polar/run/multistep.py)
        prepare_steps(state, setup, sandbox, proxy, task.max_calls, cfg.sampling)
    else:
        state.session = new_session(proxy, task.task_id, cfg.sample_id, task.max_calls, cfg.sampling)
        rendered = prepare_harness(setup, sandbox, mounts, state.session, proxy, state.out, task.workspace)
    if task.healthcheck and not _healthy(task, sandbox, mounts, state):
        return
    state.harness = {"steps": len(task.steps)} if task.steps else {
        "argv": list(rendered.argv), "env": with_task_vars(rendered.env, task.env)}


def _agent_disk(state: SampleState) -> None:
    """HOME and the workspace on a disk of the task's quota (polar/sandbox/quota.py), when this node can."""
    size = quota.quota_mb(state.task.storage_mb)
    why = quota.unavailable() if size else None
    if size is None or why:
        if why:
            quota.warn_unenforced(why)
        return
    state.disk_mb = size
    state.save()  # released by cleanup even if we die now
    quota.make_disk(state.out / quota.DISK, size, _agent_binds(state.out))


def _agent_binds(out: Path) -> tuple[tuple[str, Path], ...]:
    return (("home", out / "home"), ("workspace", out / "workspace"))


def _healthy(task: TaskSpec, sandbox: Sandbox, mounts: Mounts, state: SampleState) -> bool:
    """The task's healthcheck in the agent's sandbox, before the agent: a failing one fails the sample as
    infrastructure (the environment is not what the task expects). The workspace is snapshotted again after it."""
    out = state.out
    failed = script_failure(sandbox, mounts, task.env, ["sh", "-c", task.healthcheck or "true"],
                            task.healthcheck_timeout_s, out / "healthcheck")
    if failed:
        state.fail("prepare", f"the task's healthcheck {failed}")
        return False
    snapshot_workspace(mounts, out)
    return True


def run_harness(sample_dir: Path) -> None:
    """The harness in the sample's sandbox, within the task's budget (less when the session budget is shorter)."""
    out = Path(sample_dir)
    start, cpu = time.monotonic(), host_cpu_s()
    state = load_state(out)
    if state.outcome is None:
        budget = min(state.task.timeout_s, state.session_left())
        assert state.harness is not None  # rendered by prepare, which set an outcome otherwise
        try:
            with occupying():  # this node's own count of running samples (a verifier's timeout: whose?)
                if state.task.steps:
                    run_steps(state, _sandbox(state), _verify_on, lambda key, s: _end_session(state, key, s))
                else:
                    result = exec_harness(_sandbox(state), state.harness["argv"], state.harness["env"],
                                          state.mounts, state.proxy, budget, out)
                    state.exit_code, state.timed_out = result.exit_code, result.timed_out
        except Exception as e:  # noqa: BLE001
            state.fail("harness", f"{type(e).__name__}: {e}")
    _timed(state, "run", start, cpu)
    state.save()


def evaluate_sample(sample_dir: Path) -> None:
    """The task's evaluator where the agent never was (polar/scoring/verify.py): the agent's sandbox stopped and its
    token ended first, the task's artifacts kept, then a fresh sandbox over a copy of the final workspace with the
    task's tests. Never raises: what goes wrong here that the workspace did not cause is the sample's
    infrastructure failing."""
    out = Path(sample_dir)
    start, cpu = time.monotonic(), host_cpu_s()
    state = load_state(out)
    _cleanup(state, disks=False)
    if state.task.artifacts:
        state.artifacts = keep_artifacts(out / "workspace", state.task.artifacts, out / "artifacts")
    if state.outcome is None and not state.timed_out:
        try:
            with occupying():
                if state.task.steps:
                    finish_steps(state, _verify_on)
                else:
                    _verify(state, out)
        except Exception as e:  # noqa: BLE001 - Polar's or the machine's failure, never a reward
            state.fail("evaluator", f"{type(e).__name__}: {e}")
    state.save()  # the verdict is on disk before the cleanup, which may fail
    _cleanup(state)  # the verifier's sandbox too, whatever happened
    _timed(state, "evaluate", start, cpu)
    state.save()


def _verify(state: SampleState, out: Path) -> None:
    try:
        before, after = workspace_snapshots(out)
    except WorkspaceTooLarge as e:  # the agent made them (the start was snapshotted): nothing to verify on
        state.evaluation = asdict(Evaluation(0.0, f"[polar] {e}: reward 0"))
        return
    _verify_on(state, state.task, before, after, out, changed_files(before, after))


def _verify_on(state: SampleState, task: TaskSpec, before: dict[str, str], after: dict[str, str], where: Path,
               changed: dict[str, list[str]]) -> None:
    """`task`'s verifier on the ground built from the sample's workspace now (`before`/`after`: its snapshots,
    polar/scoring/verify.py), in a fresh sandbox, its output in `where`; sets the evaluation, or the failure."""
    out, spec = state.out, task.evaluator
    summary = {"sample_id": state.sample_id, "group_id": state.group_id, "adapter": state.adapter,
               "exit_code": state.exit_code, "timed_out": state.timed_out, "task_id": task.task_id,
               "files_changed": changed}
    problem = check_verifier(task, state.runtime, out / "verifier-check")
    if problem is not None:  # the reward below would be a default 0, not the workspace's score
        state.evaluation = {"reward": None, "output": problem.output, "detail": problem.reason}
        state.fail("evaluator", f"the task's verifier produces no reward on the untouched workspace: "
                                f"{problem.reason}")
        return
    if (learned := oracle_allowlist(task, state.runtime, out / "oracle")) is not None:
        task = dataclasses.replace(task, submit=learned)  # no `submit`: what the task's oracle changed
    ground = prepare_verify(task, out, before, after, state.disk_mb)
    state.tampered, state.suspicious = list(ground.tampered), list(ground.suspicious)
    hosts = state.verifier_hosts
    mounts = dataclasses.replace(ground.mounts, root_writable=hosts is not None)  # apt-get in its test.sh
    sandbox = get_runtime(state.runtime, limits=task.sandbox_limits()).prepare(
        mounts, image=task.image, instance=f"polar-verify-{state.sample_id[:33]}-{uuid.uuid4().hex[:6]}")
    state.verify_instance = sandbox.name
    state.cleaned["verify_sandbox"] = False
    state.save()  # stopped by cleanup even if this process dies now
    try:
        with verifier_egress(sandbox, hosts, mounts.shared, where / "egress.jsonl") as verifying:
            result = evaluate(spec, verifying, mounts, where, summary, min(spec.timeout_s, state.session_left()),
                              task.reward_range)
        state.evaluation = {**asdict(result), "notes": list(ground.notes)}
        state.suspicious += [f"observer: {flag}" for flag in result.flagged]
    except EvaluatorCrash as e:
        state.evaluation = {"reward": None, "output": e.output, "detail": str(e)}
        state.fail("evaluator", str(e))
    if state.task.steps:  # a step's verifier: the next step's verifies in a sandbox of its own
        sandbox.stop()
        state.cleaned["verify_sandbox"] = True


def postrun_sample(sample_dir: Path) -> SampleResult:
    """Trajectories with the outcome, the session ended, the sandbox stopped; result.json. Idempotent cleanup."""
    out = Path(sample_dir)
    start, cpu = time.monotonic(), host_cpu_s()
    state = load_state(out)
    _cleanup(state)
    files = _captures(state)
    status, failure, reason, reward = _outcome(state, files)
    entry = {"session_id": state.sample_id, "status": status, "failure": failure, "reason": reason,
             "reward": reward, "group_id": state.group_id, "harness": state.adapter,
             "metadata": {**state.task.metadata, "sample_id": state.sample_id, "task_id": state.task.task_id,
                          "exit_code": state.exit_code, "runtime": state.runtime, "tampered": state.tampered,
                          "suspicious": state.suspicious, **_named_rewards(state),
                          **({"steps": step_results(state)} if state.task.steps else {}),
                          **({"artifacts": state.artifacts} if state.artifacts else {})}}
    entry["metadata"] = printable(entry["metadata"])  # names and keys the agent chose: never a failed build
    parquet, build_error = _build(out, files, _entries(state, entry), state.strategy)
    status, failure, reason, reward = after_build(status, failure, reason, reward, build_error)
    from polar_traj.outcomes import parse_entry, resolve  # lazy: numpy and the trajectory builder

    resolved = resolve(parse_entry({k: v for k, v in entry.items() if k != "metadata"} | {
        "status": status, "failure": failure}))
    _timed(state, "postrun", start, cpu)
    evaluation = state.evaluation or {}
    result = SampleResult(
        state.sample_id, state.task.task_id, state.group_id, state.adapter, resolved.status,
        resolved.failure, reason, resolved.reward, 1.0 if resolved.trainable else 0.0, state.exit_code,
        evaluation.get("output", ""), state.timings, str(parquet) if parquet else None,
        [str(f) for f in files], state.node, state.runtime, count_calls(files), state.tampered, state.suspicious,
        step_results(state), list(evaluation.get("notes") or ()))
    state.save()
    atomic.write_text(out / RESULT, json.dumps(result.to_dict(), indent=2))
    return result


def after_build(status: str, failure: str | None, reason: str | None, reward: float | None,
                build_error: str | None) -> tuple[str, str | None, str | None, float | None]:
    """The outcome once the rows were built or not: rows the session's own content broke (the agent's doing) are
    a trainable 0, never a masked retry; rows the host failed to write mask the sample; an earlier outcome
    stands, with the reason its rows are missing."""
    if build_error and failure is None and build_error.startswith(CONTENT_FAILURE):
        return status, failure, build_error, 0.0
    if build_error and failure is None:
        return "error", "infrastructure", build_error, reward
    if build_error:
        return status, failure, f"{reason}; {build_error}", reward
    return status, failure, reason, reward


def printable(value: Any) -> Any:
    """`value` with every string (keys too) encodable as UTF-8: a lone surrogate (a file name that is not UTF-8, a
    reward.json key) becomes a backslash escape."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
            return value
        except UnicodeEncodeError:
            return value.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(value, dict):
        return {printable(k): printable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [printable(v) for v in value]
    return value


def _named_rewards(state: SampleState) -> dict[str, Any]:
    """A Harbor verifier's reward.json (the main reward and its named extras), for the rows' metadata."""
    rewards = (state.evaluation or {}).get("rewards") if state.outcome is None else None
    return {"rewards": rewards} if rewards else {}


def cleanup_sample(sample_dir: Path, disks: bool = True) -> None:
    """End the session, stop the sandboxes and (`disks`) unmount the sample's disks; safe to call more than once and
    on any stage's failure."""
    state = load_state(Path(sample_dir))
    _cleanup(state, disks)
    state.save()


def _cleanup(state: SampleState, disks: bool = True) -> None:
    done = state.cleaned
    for key, session in _sessions(state):
        _end_session(state, key, session)
    for key, mounts, instance in (("sandbox", state.mounts, state.instance),
                                  ("verify_sandbox", state.verify_mounts, state.verify_instance)):
        if instance and not done.get(key):
            try:
                get_runtime(state.runtime).attach(mounts, state.task.image, instance).stop()
            except Exception as e:  # noqa: BLE001
                state.cleanup_errors.append(f"stop {key.replace('_', ' ')}: {e}")
            done[key] = True
    if state.shared_temporary:
        shutil.rmtree(state.shared, ignore_errors=True)
        supervisor.release(f"path:{state.shared}")
    if disks and state.disk_mb and not done.get("disks"):
        try:
            quota.remove_disk(state.out / quota.VERIFY_DISK, (("ground", state.out / "verify"),))
            quota.remove_disk(state.out / quota.DISK, _agent_binds(state.out))
        except Exception as e:  # noqa: BLE001
            state.cleanup_errors.append(f"unmount disks: {e}")
        done["disks"] = True


def _sessions(state: SampleState) -> list[tuple[str, SessionLogin]]:
    """(cleanup key, session): the sample's one, or each of its steps'."""
    return [("session", state.session)] if state.session else list(step_sessions(state))


def _end_session(state: SampleState, key: str, session: SessionLogin) -> None:
    """Unregister the session (its token stops working), once."""
    if state.proxy.sessions == "open" or state.cleaned.get(key):
        return
    try:
        from polar_mitm.sessions.registry import unregister_session  # lazy: it brings aiohttp (0.3 s)

        unregister_session(state.proxy.sessions, session.token)
    except Exception as e:  # noqa: BLE001
        state.cleanup_errors.append(f"unregister session: {e}")
    state.cleaned[key] = True


def host_cpu_s() -> float:
    """CPU seconds of this process and of the children it has waited for (sandboxes, harness, evaluator)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _timed(state: SampleState, stage: str, start: float, cpu: float) -> None:
    """The stage's wall time (`<stage>_s`) and host CPU (`<stage>_cpu_s`) in the sample's timings."""
    state.timings[f"{stage}_s"] = round(time.monotonic() - start, 3)
    state.timings[f"{stage}_cpu_s"] = round(host_cpu_s() - cpu, 3)


def _outcome(state: SampleState, files: list[Path]) -> tuple[str, str | None, str | None, float | None]:
    if state.outcome is not None:
        o = state.outcome
        return o.status, o.failure, o.reason, None
    if state.timed_out:
        return "timeout", "agent_timeout", f"the agent ran past its {state.task.timeout_s:g}s budget", 0.0
    unreachable = _engine_unreachable(files)
    if unreachable:
        return "error", "infrastructure", unreachable, None
    return "completed", None, None, (state.evaluation or {}).get("reward")


def _engine_unreachable(files: list[Path]) -> str | None:
    """A reason when every call the harness made failed (the engine was unreachable or refused them all)."""
    errors = [r.error for f in files for r in read_capture(f)]
    if errors and all(e is not None for e in errors):
        return f"every LLM call failed ({len(errors)}): {str(errors[-1])[:300]}"
    return None


def _captures(state: SampleState) -> list[Path]:
    return [f for _key, session in _sessions(state) for f in capture_files(state.proxy, False, session, state.out)]


def _entries(state: SampleState, entry: dict[str, Any]) -> list[dict[str, Any]]:
    """The outcome entry of each session: the sample's, or one per step, whose rows carry the step, its number
    and its reward (the rows' own reward is the sample's)."""
    if not state.task.steps:
        return [entry]
    out = []
    for i, ((_key, session), result) in enumerate(zip(step_sessions(state), step_results(state))):
        metadata = {**entry["metadata"], "step": result["name"], "step_index": i + 1,
                    "step_reward": result["reward"]}
        out.append({**entry, "session_id": session.session_id, "metadata": metadata})
    return out


def _build(out: Path, files: list[Path], entries: list[dict[str, Any]], strategy: str
           ) -> tuple[Path | None, str | None]:
    if not files:
        return None, None
    target = out / "trajectories.parquet"
    built, error = build_trajectories(files, target, entries, whole_dir=len(entries) > 1, strategy=strategy)
    return (target, None) if built is not None else (None, error)


# -- all four in a row --------------------------------------------------------------------------------------------
def run_sample(cfg: SampleConfig, engine: EngineConfig, proxy: ProxyProcess | None = None) -> SampleResult:
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
    if not shutil.which("redis-server"):
        return "open"
    return stack.enter_context(private_redis(folder))
