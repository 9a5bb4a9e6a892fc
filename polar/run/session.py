"""One harness session end to end: fresh HOME and workspace, engine and proxy (started or reused), the harness
in a loopback-only sandbox, then its trajectories (prefix_merge) and a summary, all kept in the run folder.

Run folder (`out`):
  home/ workspace/         the harness's HOME and working directory
  sandbox/                 sockets to the proxy and the CA files, as the sandbox sees them (a short temporary
                           directory instead when this path is too long for a unix socket)
  captures/<task>/<s>.jsonl  the session's CallRecords (the proxy's own folder when it was started here)
  harness.stdout, harness.stderr, harness.json (argv and environment, token redacted)
  logs/                    reference server and proxy logs (when started here)
  trajectories.parquet     the session's trajectories, prefix_merge
  run.json                 exit status, timings, summary
"""
from __future__ import annotations

import json
import os
import shutil
import tarfile
import tempfile
import time
import uuid
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Mapping

from polar.harness.adapters import AdapterSpec
from polar.harness.render import Endpoint, Rendered, RunValues, redact, render, write_files
from polar.run.local_redis import private_redis
from polar.run.services import ROOT, SessionLogin, context_view, new_session, reference_server, start_proxy
from polar.run.summary import RunSummary, WorkspaceTooLarge, changed_files, snapshot, summarize
from polar.sandbox import supervisor
from polar.sandbox.bridge import UnixToTcp
from polar.sandbox.runtime import ExecResult, Mounts, Sandbox, get_runtime
from polar.sandbox.agent_files import folder_beneath
from polar_mitm.launch import ProxyProcess
from polar_traj.captures import copy_capture

TOOLS_BIN = ROOT / ".tools" / "npm" / "node_modules" / ".bin"
HARNESS_BIN = ROOT / ".tools" / "bin"  # commands of harnesses in their own environments (Python venvs, OpenClaw)
DEFAULT_CONFDIR = Path("~/.polar/mitmproxy").expanduser()


@dataclass(frozen=True)
class EngineConfig:
    """The inference engine: reuse `backend`, or start the reference server on `model_dir` with `policy`."""

    model_dir: Path  # tokenizer + chat template (and weights for the reference server)
    backend: str | None = None
    engine: str = "sglang"  # token API of `backend`: sglang (/generate) or vllm (/v1/completions)
    render: str = "proxy"  # who renders prompts and parses replies: the proxy, or the engine's chat API
    policy: Path | None = None
    context_length: int = 65536  # reference server only: harness prompts are long (0 = the model's own)


@dataclass(frozen=True)
class RunConfig:
    adapter: AdapterSpec
    instruction: str
    out: Path
    way_in: str = "https_proxy"
    runtime: str = "auto"  # the most isolated runtime installed; "local" only when asked (polar/sandbox/runtime.py)
    timeout_s: float = 600.0
    model: str | None = None  # model name the harness asks for; default: the adapter's
    workdir: Path | None = None  # copied into the workspace first
    task_id: str = "local"
    session_id: str | None = None
    confdir: Path = DEFAULT_CONFDIR  # where a proxy started here keeps its CA
    tools_bin: tuple[Path, ...] = (TOOLS_BIN, HARNESS_BIN)
    # fixed sampling for every call (polar_mitm/sessions/sampling.py): a proxy started here then keeps its session
    # in a private Redis (open mode has no registry to carry it)
    sampling: dict[str, Any] | None = None


@dataclass
class RunResult:
    out: Path
    exit_code: int
    timed_out: bool
    status: str  # completed | timeout | error
    session: dict[str, str]
    timings: dict[str, float]
    summary: RunSummary
    error: str | None = None
    files: list[str] = field(default_factory=list)  # capture files of this run

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["out"] = str(self.out)
        return data


class Timer:
    def __init__(self) -> None:
        self.marks: dict[str, float] = {}
        self.t0 = time.monotonic()

    def lap(self, name: str, since: float) -> float:
        now = time.monotonic()
        self.marks[name] = round(now - since, 3)
        return now


def run_session(cfg: RunConfig, engine: EngineConfig, proxy: ProxyProcess | None = None) -> RunResult:
    """Run one session; never raises for a harness failure (a crashed harness still gets its summary)."""
    if not cfg.adapter.supports(cfg.way_in):
        raise ValueError(f"adapter {cfg.adapter.name} does not support --via {cfg.way_in} "
                         f"(it supports {', '.join(cfg.adapter.ways_in)})")
    out = cfg.out
    make_run_folder(out)
    timer = Timer()
    own_proxy = proxy is None
    with ExitStack() as stack:
        t = time.monotonic()
        if proxy is None:
            sessions = stack.enter_context(private_redis(out / "logs")) if cfg.sampling else "open"
            proxy = stack.enter_context(start_services(out, engine, cfg.confdir, stack, sessions=sessions))
        t = timer.lap("services_s", t)
        sid = cfg.session_id or f"{cfg.adapter.name}-{uuid.uuid4().hex[:10]}"
        session = new_session(proxy, cfg.task_id, sid, sampling=cfg.sampling)
        result = _exec_harness(cfg, proxy, session, stack)
        timer.lap("harness_s", t)
    return _finish(cfg, proxy, own_proxy, session, result, timer)


def make_run_folder(out: Path) -> None:
    if out.exists() and any(out.iterdir()):
        raise ValueError(f"run folder {out} exists and is not empty: each run gets a fresh one")
    for d in ("home", "workspace", "logs"):
        (out / d).mkdir(parents=True, exist_ok=True)


def start_services(out: Path, engine: EngineConfig, confdir: Path, stack: ExitStack, sessions: str = "open"):
    """Start the engine (unless given) and a proxy whose capture folder is the run's (`out/captures`)."""
    model = engine.model_dir
    if engine.backend is None:
        model = context_view(engine.model_dir, engine.context_length, out / "model")
        backend = stack.enter_context(reference_server(model, engine.policy, out / "logs" / "serve.log"))
    else:
        backend = engine.backend
    return start_proxy(model, backend, out / "captures", confdir, out / "logs" / "proxy.log",
                       sessions=sessions, engine=engine.engine, render=engine.render)


MAX_SOCKET_PATH = 100  # AF_UNIX paths are limited to 107 bytes


def shared_dir(out: Path) -> tuple[Path, bool]:
    """Where the sockets and CA files the sandbox sees live: out/sandbox, or a short temporary directory when
    the run folder's path is too long for a unix socket (then True: the caller removes it)."""
    shared = out / "sandbox"
    if len(str(shared / "base-url.sock")) <= MAX_SOCKET_PATH:
        shared.mkdir(exist_ok=True)
        return shared, False
    return Path(tempfile.mkdtemp(prefix="polar-run-")), True


def write_ca(proxy: ProxyProcess, shared: Path) -> Endpoint:
    """The proxy's CA and the CA bundle (for SSL_CERT_FILE) in the shared directory: the endpoint as the sandbox
    sees it. The bundle is the proxy's CA alone: the sandbox reaches no TLS peer but the proxy, and a client
    that loads the system's ~150 CAs as well pays for it at every start (curl: 41 ms of CPU against 12)."""
    ca = shared / "proxy-ca.pem"
    shutil.copyfile(proxy.ca_cert, ca)
    os.chmod(ca, 0o644)
    bundle = shared / "ca-bundle.pem"
    shutil.copyfile(ca, bundle)
    os.chmod(bundle, 0o644)
    return Endpoint(proxy.host, proxy.proxy_port, proxy.base_url_port, ca, bundle)


def open_bridges(proxy: ProxyProcess, shared: Path, stack: ExitStack) -> list[tuple[int, Path]]:
    """One socket bridge per proxy listener, in the shared directory, closed with `stack`."""
    forwards = []
    for name, port in (("proxy.sock", proxy.proxy_port), ("base-url.sock", proxy.base_url_port)):
        bridge = UnixToTcp(shared / name, proxy.host, port)
        stack.callback(bridge.close)
        forwards.append((port, shared / name))
    return forwards


@dataclass(frozen=True)
class HarnessSetup:
    """What a harness run needs besides the sandbox: the adapter, the instruction, the session, the way in."""

    adapter: AdapterSpec
    instruction: str
    model: str
    way_in: str
    runtime: str
    tools_bin: tuple[Path, ...]


def render_harness(setup: HarnessSetup, mounts: Mounts, session: SessionLogin, endpoint: Endpoint,
                   out: Path) -> Rendered:
    """The harness's argv, environment and config files (written), harness.json (token redacted) and the
    workspace snapshot the run's changes are measured against."""
    rendered = harness_for(setup, mounts, session, endpoint)
    write_harness(rendered, mounts, session, setup.runtime, setup.way_in, out)
    return rendered


def harness_for(setup: HarnessSetup, mounts: Mounts, session: SessionLogin, endpoint: Endpoint) -> Rendered:
    """The harness's argv, environment and config files (sandbox paths), nothing written yet."""
    values = RunValues(setup.instruction, setup.model, mounts.home, mounts.cwd,
                       session.session_id, session.token, setup.way_in)
    return render(setup.adapter, values, endpoint, list(setup.tools_bin))


def write_harness(rendered: Rendered, mounts: Mounts, session: SessionLogin, runtime: str, way_in: str,
                  out: Path) -> None:
    """The rendered config files written beneath the sample's HOME and workspace, harness.json (token redacted) in
    `out`, then the workspace snapshot the run's changes are measured against."""
    folder_beneath(mounts.home, ".tmp")  # TMPDIR; a later step's HOME is the agent's: it may have put a file there
    write_files({_on_host(path, mounts): text for path, text in rendered.files.items()},
                (mounts.home, mounts.workspace))
    (out / "harness.json").write_text(json.dumps({
        "argv": list(rendered.argv), "env": redact(rendered.env, session.token),
        "files": [str(p) for p in rendered.files], "runtime": runtime, "via": way_in,
    }, indent=2))
    snapshot_workspace(mounts, out)


def snapshot_workspace(mounts: Mounts, out: Path) -> None:
    """The workspace as the harness starts on it: what the run's changes are measured against."""
    (out / "workspace.before.json").write_text(json.dumps(snapshot(mounts.workspace)))


def _on_host(path: Path, mounts: Mounts) -> Path:
    """A config file's path as the sandbox sees it, on the host: the workdir is the workspace's host folder."""
    if mounts.workdir and path.is_relative_to(mounts.cwd):
        return mounts.workspace / path.relative_to(mounts.cwd)
    return path


def with_task_vars(env: dict[str, str], task_vars: Mapping[str, str]) -> dict[str, str]:
    """The harness's environment over the task's variables (its image's ENV, its [environment] env): the
    harness's own win (HOME, the proxy, its keys), and PATH is the harness's then the task's other folders."""
    if not task_vars:
        return env
    merged = {**task_vars, **env}
    ours = env.get("PATH", "").split(os.pathsep)
    extra = [d for d in task_vars.get("PATH", "").split(os.pathsep) if d and d not in ours]
    if extra:
        merged["PATH"] = os.pathsep.join([*ours, *extra])
    return merged


def prepare_harness(setup: HarnessSetup, sandbox: Sandbox, mounts: Mounts, session: SessionLogin, proxy: ProxyProcess,
                    out: Path, workspace: Path | None) -> Rendered:
    """What `polar run` and a sample both do before the harness starts: the starting workspace (a directory or
    a .tar.gz) copied in, the proxy's CA shared, the harness's files rendered."""
    copy_workspace(sandbox, mounts, workspace)
    return render_harness(setup, mounts, session, write_ca(proxy, mounts.shared), out)


def copy_workspace(sandbox: Sandbox, mounts: Mounts, workspace: Path | None) -> None:
    """The task's starting workspace (a directory or a .tar.gz; none: empty) into the sample's."""
    if workspace is not None and workspace.is_dir():
        sandbox.copy_in(workspace, mounts.workspace)
    elif workspace is not None:
        with tarfile.open(workspace, "r:gz") as tar:
            tar.extractall(mounts.workspace, filter="data")


def exec_harness(sandbox: Sandbox, argv: list[str], env: dict[str, str], mounts: Mounts, proxy: ProxyProcess,
                 timeout_s: float, out: Path) -> ExecResult:
    """The harness in its sandbox, behind socket bridges to the proxy that live as long as it runs."""
    with ExitStack() as stack:
        forwards = open_bridges(proxy, mounts.shared, stack)
        return sandbox.exec(argv, env, mounts.cwd, timeout_s, out / "harness.stdout", out / "harness.stderr",
                            forwards)


def workspace_snapshots(out: Path) -> tuple[dict[str, str], dict[str, str]]:
    """The workspace's snapshot when the harness started (render_harness wrote it) and now."""
    return json.loads((out / "workspace.before.json").read_text()), snapshot(out / "workspace")


def changed_since_start(out: Path) -> dict[str, list[str]]:
    return changed_files(*workspace_snapshots(out))


def _exec_harness(cfg: RunConfig, proxy: ProxyProcess, session: SessionLogin, stack: ExitStack) -> ExecResult:
    out = cfg.out
    shared, temporary = shared_dir(out)
    if temporary:
        stack.callback(supervisor.watch_path(shared).release)
        stack.callback(shutil.rmtree, shared, True)
    mounts = Mounts(out / "home", out / "workspace", shared)
    sandbox = get_runtime(cfg.runtime).prepare(mounts)
    stack.callback(sandbox.stop)
    setup = HarnessSetup(cfg.adapter, cfg.instruction, cfg.model or cfg.adapter.model, cfg.way_in, cfg.runtime,
                         cfg.tools_bin)
    rendered = prepare_harness(setup, sandbox, mounts, session, proxy, out, cfg.workdir)
    return exec_harness(sandbox, list(rendered.argv), rendered.env, mounts, proxy, cfg.timeout_s, out)


def _finish(cfg: RunConfig, proxy: ProxyProcess, own_proxy: bool, session: SessionLogin, result: ExecResult,
            timer: Timer) -> RunResult:
    out = cfg.out
    t = time.monotonic()
    files = capture_files(proxy, own_proxy, session, out)
    status = "timeout" if result.timed_out else "completed" if result.exit_code == 0 else "error"
    reason = None if status == "completed" else f"harness exited {result.exit_code}" + (
        f" after the {cfg.timeout_s:.0f}s timeout" if result.timed_out else "")
    try:
        changed, too_large = changed_since_start(out), None
    except WorkspaceTooLarge as e:
        changed, too_large = {}, str(e)
    summary, error = summarize(files, out / "trajectories.parquet", cfg.adapter.name, status, reason, changed)
    error = error or too_large
    timer.lap("build_s", t)
    timer.marks["total_s"] = round(time.monotonic() - timer.t0, 3)
    run = RunResult(out, result.exit_code, result.timed_out, status,
                    {"task_id": session.task_id, "session_id": session.session_id, "via": cfg.way_in,
                     "adapter": cfg.adapter.name, "runtime": cfg.runtime},
                    timer.marks, summary, error, [str(f) for f in files])
    (out / "run.json").write_text(json.dumps(run.to_dict(), indent=2))
    return run


def capture_files(proxy: ProxyProcess, own_proxy: bool, session: SessionLogin, out: Path) -> list[Path]:
    """This run's capture files: all of a proxy started for this run (in open mode a harness may name its
    session by its own header), else the session's own file, copied into the run folder."""
    if own_proxy:
        root = proxy.capture_dir
        return sorted(root.glob("*/*.jsonl")) if root.is_dir() else []
    src = proxy.capture_dir / session.task_id / f"{session.session_id}.jsonl"
    if not src.exists():
        return []
    return [copy_capture(src, out / "captures" / session.task_id / src.name)]  # with the shared prefixes it names
