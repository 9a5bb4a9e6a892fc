"""`polar run`: one harness session end to end (adapters/*.yaml), its trajectories and a summary; with --task, one
scored sample of a task file (docs/tasks.md): the evaluator's reward and the status in its trajectories."""
from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from polar.argtypes import positive_seconds
from polar.harness.adapters import WAYS_IN, AdapterError, available, load_adapter
from polar.run.causes import cause_lines
from polar.run.sample import SampleConfig, SampleResult, run_sample
from polar.run.services import ROOT, ServiceError, running_proxy
from polar.run.session import EngineConfig, RunConfig, run_session
from polar.run.preflight import first_message, lacks
from polar.sandbox.egress import HOSTS_ENV, default_allowlist, parse_hosts
from polar.sandbox.runtime import RUNTIMES, SandboxError, names_oci_image, resolve_runtime
from polar.sandbox.supervisor import supervising
from polar.scoring.evaluate import EvaluatorCrash
from polar.tasks.load import load_tasks, select_task
from polar.tasks.task import TaskError, TaskSpec
from polar_mitm.cli import engine_model_mismatch, tokenizer_problem
from polar_mitm.launch import ProxyProcess
from polar_mitm.sessions.sampling import add_sampling_args, sampling_from_args

DEFAULT_MODEL = ROOT / "fixtures" / "tiny-qwen2"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="run one harness session through the proxy and build its trajectories",
                       description=__doc__)
    p.add_argument("--adapter", help=f"adapter name ({', '.join(available())}) or a YAML file "
                                     "(with --task: default the task's own)")
    p.add_argument("--instruction", help="the task given to the harness (not with --task)")
    p.add_argument("--task", type=Path, help="task file (YAML or JSONL, docs/tasks.md) or Harbor task directory: "
                                             "run one scored sample")
    p.add_argument("--tasks-root", type=Path, help="where the tasks' workspaces, tests and Harbor folders may lie "
                                                   "(default: POLAR_TASKS_ROOT, else the task file's folder and the "
                                                   "current directory; docs/tasks.md)")
    p.add_argument("--oracle", action="store_true", help="with --task (a Harbor task directory): run its "
                                                         "solution/solve.sh instead of a harness, then its verifier")
    p.add_argument("--run-offline", action="store_true", help="with --task: a task that asks for the internet "
                   "(allow_internet) runs its verifier offline too (its agent always is)")
    p.add_argument("--verifier-hosts", help="with --task: the hosts the verifier of a task that asks for the "
                   "internet may reach, through Polar's egress proxy: names, *.domain, host=target:port, comma- "
                   f"separated (default: {HOSTS_ENV}, else Debian/Ubuntu mirrors, PyPI, the uv installer; "
                   "docs/tasks.md)")
    p.add_argument("--image", help="with --task: use this image (SIF, sandbox directory, OCI image or `host`) "
                                    "instead of the task's")
    p.add_argument("--via", default="https_proxy", choices=WAYS_IN, help="way in to the proxy")
    engine = p.add_mutually_exclusive_group()
    engine.add_argument("--policy", type=Path, help="scripted policy for the reference server started here")
    engine.add_argument("--backend", help="use this inference server (SGLang/vLLM/polar serve URL; several replicas "
                        "comma-separated)")
    p.add_argument("--engine", default="sglang", choices=["sglang", "vllm"], help="token API of --backend")
    p.add_argument("--render", default="proxy", choices=["proxy", "engine"],
                   help="who renders prompts and parses replies: proxy (default, token-exact history) or engine "
                        "(the engine's chat API: any model it serves; docs/models.md)")
    p.add_argument("--model", type=Path, help="model dir: tokenizer + chat template; required with --backend "
                   "(default with the reference server started here: fixtures/tiny-qwen2)")
    p.add_argument("--model-name", help="model name the harness asks for (default: the adapter's)")
    p.add_argument("--context-length", type=int, default=65536,
                   help="context of the reference server started here (harness prompts are long; 0 = model's)")
    p.add_argument("--workdir", type=Path, help="directory copied into the fresh workspace")
    p.add_argument("--runtime", default="auto", choices=RUNTIMES,
                   help="auto (default): the most isolated installed (bwrap: bubblewrap, a minimal read-only view "
                        "of the host, no network); local: loopback-only namespaces on the host filesystem, which "
                        "the harness can write (opt-in, with a warning)")
    p.add_argument("--out", type=Path, help="run folder (default: runs/<adapter>-<time>)")
    p.add_argument("--timeout", type=positive_seconds, default=600.0, help="seconds before the harness is stopped")
    p.add_argument("--confdir", type=Path, default=Path("~/.polar/mitmproxy"), help="CA dir of a proxy started here")
    add_sampling_args(p)  # a bare session too: its own proxy then keeps the session in a private Redis
    reuse = p.add_argument_group("reuse a running proxy (polar proxy) instead of starting one")
    reuse.add_argument("--proxy", help="its HTTPS_PROXY listener, http://127.0.0.1:PORT")
    reuse.add_argument("--proxy-base-url", help="its base-URL listener, http://127.0.0.1:PORT")
    reuse.add_argument("--proxy-ca", type=Path, help="its CA (default: CONFDIR/mitmproxy-ca-cert.pem)")
    reuse.add_argument("--capture-dir", type=Path, help="its --capture-dir")
    reuse.add_argument("--sessions", default="open", help="its --sessions: 'open' or the redis:// URL")
    reuse.add_argument("--task-id", help="with --task: which task of the file; else the task id of the registered "
                                         "session (redis; default local)")
    p.set_defaults(func=run)


def reused_proxy(args: argparse.Namespace) -> ProxyProcess | None:
    if not args.proxy:
        return None
    if not (args.proxy_base_url and args.capture_dir):
        raise ValueError("--proxy needs --proxy-base-url and --capture-dir too")
    if args.sessions == "open" and args.via == "base_url":
        raise ValueError("a reused proxy in open mode names base-URL sessions by the harness's own session "
                         "header: start it with --sessions redis://… and pass the same URL here")
    ca = args.proxy_ca or args.confdir.expanduser() / "mitmproxy-ca-cert.pem"
    return running_proxy(args.proxy, args.proxy_base_url, args.capture_dir, ca, args.sessions)


def _engine(args: argparse.Namespace) -> EngineConfig:
    """The engine settings, checked before anything starts; ValueError naming the flag that is wrong."""
    if args.model is None and args.backend:  # never record a user's engine with the tiny model's ids
        raise ValueError("--backend needs --model DIR: the tokenizer and chat template of the model that engine "
                         "serves (fixtures/tiny-qwen2 is the default only for the reference server started here)")
    model = args.model or DEFAULT_MODEL
    if (problem := tokenizer_problem(model)) is not None:
        raise ValueError(f"--model: {problem}")
    if args.policy is not None:
        _check_policy(args.policy)
    if args.backend and (warning := engine_model_mismatch(args.backend, model)) is not None:
        print(f"polar run: warning: {warning}", file=sys.stderr)
    return EngineConfig(model.resolve(), args.backend, args.engine, args.render,
                        args.policy.resolve() if args.policy else None, args.context_length)


def _check_policy(path: Path) -> None:
    from polar_serve.policy import load_policy

    if not path.is_file():
        raise ValueError(f"--policy {path}: no such file")
    try:
        load_policy(path)
    except ValueError as e:
        raise ValueError(f"--policy {' '.join(str(e).split())}"[:300]) from e


def run(args: argparse.Namespace) -> int:
    """Under one watchdog (polar/sandbox/supervisor.py): what the run starts is stopped even if it is killed."""
    with supervising():
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    if args.task is not None:
        return run_task(args)
    if not (args.adapter and args.instruction):
        print("polar run: --adapter and --instruction are required (or give --task FILE)", file=sys.stderr)
        return 2
    try:
        spec = load_adapter(args.adapter)
        proxy = reused_proxy(args)
        sampling = fixed_sampling(args, proxy)
        engine = _engine(args)
        if args.workdir is not None and not args.workdir.is_dir():
            raise ValueError(f"--workdir {args.workdir}: no such directory")
    except (AdapterError, ValueError) as e:
        print(f"polar run: {e}", file=sys.stderr)
        return 2
    out = args.out or Path("runs") / f"{spec.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    cfg = RunConfig(spec, args.instruction, out.resolve(), args.via, args.runtime, args.timeout, args.model_name,
                    args.workdir.resolve() if args.workdir else None, args.task_id or "local",
                    confdir=args.confdir.expanduser(), sampling=sampling)
    try:
        with Progress(None if proxy else cfg.out / "captures"):  # a reused proxy's folder has others' calls
            result = run_session(cfg, engine, proxy)
    except (ServiceError, SandboxError, ValueError, OSError) as e:
        print(f"polar run: {e}", file=sys.stderr)
        return 2
    print(f"polar run: {spec.name} via {args.via} ({resolve_runtime(args.runtime)}): exit {result.exit_code}"
          f"{' (timed out)' if result.timed_out else ''}, status {result.status}, "
          f"harness {result.timings.get('harness_s', 0):.1f}s, total {result.timings.get('total_s', 0):.1f}s")
    for line in result.summary.lines():
        print(f"  {line}")
    if result.error:
        print(f"  {result.error}")
    if result.status != "completed":
        for line in cause_lines(out.resolve(), [Path(f) for f in result.files]):
            print(f"  {line}")
    print(f"  run folder: {out}")
    if result.timed_out:
        return 124
    return result.exit_code or (1 if result.error else 0)


def fixed_sampling(args: argparse.Namespace, proxy: ProxyProcess | None) -> dict[str, Any] | None:
    """The sampling flags given, checked (ValueError naming the bad one). A reused proxy must keep its sessions
    in Redis to carry them; one started here does (a private Redis when they are given)."""
    sampling = sampling_from_args(args)
    if sampling and proxy is not None and proxy.sessions == "open":
        raise ValueError("fixed sampling needs the reused proxy's sessions in Redis (--sessions redis://…)")
    return sampling


def run_task(args: argparse.Namespace) -> int:
    """`polar run --task FILE [--task-id ID]`: one scored sample (run_sample), printed as the run summary plus
    status, reward and the evaluator's output; trajectories.parquet in the sample folder."""
    if args.instruction or args.workdir:
        print("polar run: --instruction and --workdir come from the task file with --task", file=sys.stderr)
        return 2
    try:
        task = select_task(load_tasks(args.task, args.tasks_root), args.task_id, args.task)
        if args.image:
            as_is = args.image == "host" or names_oci_image(args.image)
            image = args.image if as_is else str(Path(args.image).resolve())
            task = dataclasses.replace(task, image=image)
        hosts = verifier_hosts(args)
        if problems := lacks(task, args.runtime):  # all of them at once, each with its fix
            raise ValueError(first_message(task, problems))
        if args.runtime in ("bwrap", "local") and task.image not in (None, "host"):
            # these runtimes show the host's own system: say so rather than ignore the image in silence
            print(f"polar run: note: --runtime {args.runtime} runs on this host's system, not task "
                  f"{task.task_id}'s image {task.image} (--image host says so; apptainer or docker use it)",
                  file=sys.stderr)
        if args.oracle:
            return run_task_oracle(args, task, hosts)
        adapter_name = args.adapter or task.adapter
        if not adapter_name:
            raise ValueError(f"task {task.task_id} names no adapter: pass --adapter")
        spec = load_adapter(adapter_name)
        proxy = reused_proxy(args)
        sampling = fixed_sampling(args, proxy)
        engine = _engine(args)
        _check_image(task.image, "--image" if args.image else f"task {task.task_id}: image")
    except (TaskError, AdapterError, ValueError) as e:
        print(f"polar run: {e}", file=sys.stderr)
        return 2
    sample_id = f"{task.task_id}-{uuid.uuid4().hex[:8]}"[-128:]
    out = (args.out or Path("runs") / f"{task.task_id}-{spec.name}-{time.strftime('%Y%m%d-%H%M%S')}").resolve()
    cfg = SampleConfig(task, spec, out, sample_id, task.task_id, args.runtime, args.via, args.model_name,
                       confdir=args.confdir.expanduser(), sampling=sampling, verifier_hosts=hosts)
    try:
        with Progress(None if proxy else out / "services" / "captures"):
            result = run_sample(cfg, engine, proxy)
    except (ServiceError, ValueError, OSError) as e:
        print(f"polar run: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:  # Ctrl-C or SIGTERM: run_sample stopped the sandbox and ended the session
        print(f"polar run: interrupted ({e or 'SIGINT'}); sandbox stopped, sample folder {out}", file=sys.stderr)
        return 130
    t = result.timings
    print(f"polar run: task {task.task_id}, {spec.name} via {args.via} ({result.runtime}): "
          f"{result.calls} calls, prepare {t.get('prepare_s', 0):.1f}s, harness {t.get('run_s', 0):.1f}s, "
          f"evaluate {t.get('evaluate_s', 0):.1f}s")
    for line in outcome_summary(result):
        print(f"  {line}")
    for i, step in enumerate(result.steps):
        reward = "not run" if not step["ran"] else "timed out" if step["timed_out"] else (
            f"reward {step['reward']:g}" if step["reward"] is not None else "not scored")
        print(f"  step {i + 1} {step['name']}: {reward}" + (f" ({step['stopped']}: the steps after it did not run)"
                                                           if step.get("stopped") else ""))
    if result.status == "error":
        for line in cause_lines(out, [Path(f) for f in result.capture_files]):
            print(f"  {line}")
    print(f"  trajectories: {result.trajectories or 'none (no LLM call recorded)'}")
    print(f"  sample folder: {out}")
    return 0 if result.status == "completed" else 124 if result.status == "timeout" else 1


def verifier_hosts(args: argparse.Namespace) -> tuple[str, ...] | None:
    """The verifier's egress list for this run (None: --run-offline); EgressError for a malformed one."""
    if args.run_offline:
        return None
    allow = parse_hosts([args.verifier_hosts]) if args.verifier_hosts else default_allowlist()
    return allow.entries()


def run_task_oracle(args: argparse.Namespace, task: TaskSpec, hosts: tuple[str, ...] | None) -> int:
    """`polar run --task DIR --oracle`: the task's solution instead of a harness (polar/scoring/oracle.py); exit 0
    when it scores the task's top reward."""
    from polar.tasks.harbor import solution_of
    from polar.scoring.oracle import gold_solution, run_oracle

    given = Path(args.task)
    if "swe" in task.metadata:  # an SWE-style instance: its gold patch
        solve = gold_solution(task, Path(tempfile.mkdtemp(prefix="polar-gold-")))
    elif given.is_file() and given.name != "task.toml":  # it once named tasks.yaml/<id>/solution/solve.sh
        raise TaskError(f"--oracle: {given} is a tasks file, and its tasks have no solution; --oracle runs the "
                        "solution/solve.sh of a Harbor task (give a Harbor task directory: task.toml, solution/) "
                        "or the gold patch of an SWE-style instance")
    elif task.steps:  # each step's own steps/<name>/solution/solve.sh
        if not any(step.solution for step in task.steps):
            raise TaskError(f"--oracle: task {task.task_id} is a multi-step task, and none of its steps has "
                            "steps/<name>/solution/solve.sh")
        solve = None
    else:  # TaskError: caught by the caller
        solve = solution_of(given.parent if given.is_file() else given, task.task_id, args.tasks_root)
    _check_image(task.image, "--image" if args.image else f"task {task.task_id}: image")
    out = (args.out or Path("runs") / f"{task.task_id}-oracle-{time.strftime('%Y%m%d-%H%M%S')}").resolve()
    if out.exists():
        raise ValueError(f"--out {out} exists: the oracle gets a fresh folder")
    try:
        result = run_oracle(task, solve, args.runtime, out, verifier_hosts=hosts)
    except (SandboxError, EvaluatorCrash, OSError) as e:
        print(f"polar run: oracle for task {task.task_id}: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    finally:
        if "swe" in task.metadata:
            shutil.rmtree(solve.parent, ignore_errors=True)
    reward = result.evaluation.reward
    print(f"polar run: oracle for task {task.task_id} ({result.runtime}): solve.sh exit {result.exit_code}, "
          f"reward {reward:g}")
    if result.allowlist is not None and result.allowlist.source == "oracle":
        print(f"  allowlist learned from the oracle's changes: {', '.join(result.allowlist.globs) or 'none'}")
    for line in result.notes:
        print(f"  {line}")
    if result.evaluation.rewards:
        print(f"  rewards: {json.dumps(result.evaluation.rewards)}")
    for i, step in enumerate(result.steps):
        print(f"  step {i + 1} {step['name']}: solve.sh exit {step['exit_code']}, reward {step['reward']:g}"
              + (f" ({step['stopped']}: the steps after it did not run)" if step.get("stopped") else ""))
    print(f"  oracle folder: {out}")
    return 0 if reward == task.reward_range[1] else 1


def _check_image(image: str | None, where: str) -> None:
    """An image is `host`, an OCI image (the runtime finds it) or a path that must exist here."""
    if image is None or image == "host" or names_oci_image(image):
        return
    if not Path(image).exists():
        raise ValueError(f"{where} {image}: no such file or directory (a SIF, a sandbox directory, an OCI image "
                         "name or `host`)")


class Progress:
    """While a run goes on, one line on a terminal every `interval_s`: LLM calls so far, tokens sampled and time
    elapsed, read from the capture folder (a run otherwise shows nothing until it ends); each file is read from
    where the last line stopped. Silent when stderr is not a terminal or there is no folder of this run's own
    (`captures` None)."""

    def __init__(self, captures: Path | None, interval_s: float = 10.0) -> None:
        self.captures, self.interval_s = captures, interval_s
        self.start, self.done = time.monotonic(), threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.read_to: dict[Path, int] = {}  # capture file -> bytes counted so far (whole lines)
        self.calls = self.tokens = 0

    def __enter__(self) -> Progress:
        if self.captures is not None and sys.stderr.isatty():
            self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.done.set()

    def line(self) -> str:
        root = self.captures
        for f in sorted(root.glob("*/*.jsonl")) if root is not None and root.is_dir() else []:
            self._count(f)
        return (f"polar run: {self.calls} LLM calls so far, {self.tokens} tokens sampled, "
                f"{time.monotonic() - self.start:.0f}s elapsed")

    def _count(self, path: Path) -> None:
        from polar_traj.captures import loads_line

        try:
            with path.open("rb") as f:
                f.seek(self.read_to.get(path, 0))
                data = f.read()
        except OSError:  # rotated or removed under us: the next line counts again
            return
        whole = data[:data.rfind(b"\n") + 1]  # a line still being written is counted next time
        self.read_to[path] = self.read_to.get(path, 0) + len(whole)
        for raw in whole.splitlines():
            try:
                record = loads_line(raw)
            except ValueError:
                continue
            self.calls += 1
            self.tokens += len(record.get("output_ids") or ()) if isinstance(record, dict) else 0

    def _loop(self) -> None:
        while not self.done.wait(self.interval_s):
            print(self.line(), file=sys.stderr, flush=True)


def outcome_summary(result: SampleResult) -> list[str]:
    reward = "none" if result.reward is None else f"{result.reward:g}"
    lines = [f"status {result.status}" + (f" ({result.failure})" if result.failure else "") +
             f", reward {reward}, weight {result.weight:g}, harness exit {result.exit_code}"]
    if result.reason:
        lines.append(f"reason: {result.reason}")
    if result.tampered:
        lines.append(f"tampered: {', '.join(result.tampered)} (dropped before verification)")
        lines += [f"  {note}" for note in result.notes]
    if result.suspicious:
        lines.append(f"suspicious: {'; '.join(result.suspicious[:10])}" +
                     (f" (and {len(result.suspicious) - 10} more)" if len(result.suspicious) > 10 else ""))
    if result.evaluator_output.strip():
        lines.append("evaluator output:")
        lines += [f"  {line}" for line in result.evaluator_output.strip().splitlines()[-15:]]
    return lines

