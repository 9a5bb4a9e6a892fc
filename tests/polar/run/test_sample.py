"""Scored samples end to end (polar/run/sample.py, issue 9): the three demo tasks with two real harnesses (codex and
the node CLI pi) in real Apptainer through the real proxy and reference server; an agent timeout; a missing
image; a crashing evaluator; a rootless run as `nobody`. Each checks the status, reward and weight of the result
and of the trajectory rows in Parquet. A policy that does not fix the bug scores 0 through `polar run --task` in
tests/polar/run/test_docker_sample.py (and, hacking, in Apptainer: tests/polar/scoring/test_reward_hacks.py)."""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml
from transformers import AutoTokenizer

from polar.harness.adapters import load_adapter
from polar.run.session import EngineConfig
from polar.run.sample import SampleConfig, SampleResult, run_sample
from polar.run.services import start_proxy
from polar.tasks.load import load_tasks
from polar.tasks.task import EvaluatorSpec
from polar_traj import read as read_trajectories
from polar_traj.capture_reader import read_capture_dicts
from tests.polar.sandbox.test_apptainer import apptainer_bin, demo_image
from tests.prompt_oracle import assert_prompt_faithful


ROOT = Path(__file__).resolve().parents[3]
DEMO = ROOT / "fixtures" / "tasks" / "tasks.yaml"
HARNESSES = ("codex", "pi")
WORKERS = 3


def sample(task, adapter: str, out: Path, runtime: str = "apptainer") -> SampleConfig:
    sid = f"{task.task_id}-{adapter}"
    return SampleConfig(task, load_adapter(adapter), out / sid, sid, task.task_id, runtime)


@pytest.fixture(scope="module")
def fixed(tmp_path_factory, start_reference_server, policies_dir, long_model, redis_url):
    """Every demo task x harness with fix-bug.yaml, plus a crashing evaluator and a missing image, on one
    engine and one proxy (sessions in Redis), three samples at a time."""
    demo_image()
    backend = start_reference_server(policies_dir / "fix-bug.yaml", long_model, "--threads", "2")
    tmp = tmp_path_factory.mktemp("samples")
    tasks = load_tasks(DEMO)
    crash = dataclasses.replace(tasks[0], task_id="fix-calc-crash",
                                evaluator=EvaluatorSpec("python", python="tests.polar.scoring.task_evaluators:no_number"))
    no_image = dataclasses.replace(tasks[1], task_id="fix-greet-no-image", image=str(tmp / "no-such-image"))
    configs = {(t.task_id, a): sample(t, a, tmp) for t in tasks for a in HARNESSES}
    configs[("crash", "pi")] = sample(crash, "pi", tmp)
    configs[("no-image", "pi")] = sample(no_image, "pi", tmp)
    engine = EngineConfig(long_model, backend=backend)
    with start_proxy(long_model, backend, tmp / "captures", tmp / "mitm", tmp / "proxy.log", redis_url) as proxy:
        with ThreadPoolExecutor(WORKERS) as pool:
            futures = {key: pool.submit(run_sample, cfg, engine, proxy) for key, cfg in configs.items()}
    return {key: (configs[key], future) for key, future in futures.items()}


@pytest.fixture(scope="module")
def tokenizer(long_model):
    return AutoTokenizer.from_pretrained(str(long_model))


def rows(result: SampleResult) -> list[dict]:
    assert result.trajectories, f"{result.status} {result.reason}: {result.capture_files}"
    return read_trajectories(result.trajectories).to_pylist()


def diagnose(cfg: SampleConfig) -> str:
    err = cfg.out / "harness.stderr"
    return f"sample folder {cfg.out}:\n{err.read_text()[-1500:] if err.exists() else ''}"


@pytest.mark.slow
@pytest.mark.parametrize("harness", HARNESSES)
@pytest.mark.parametrize("task_id", ["fix-calc", "fix-greet", "fix-wordcount"])
def test_fixed_bug_scores_one(fixed, tokenizer, task_id: str, harness: str) -> None:
    cfg, future = fixed[(task_id, harness)]
    result = future.result()
    assert (result.status, result.failure, result.reward, result.weight) == ("completed", None, 1.0, 1.0), \
        f"{result}\n{diagnose(cfg)}"
    assert result.exit_code == 0 and result.runtime == "apptainer"
    assert "1 passed" in result.evaluator_output
    state = json.loads((cfg.out / "sample.json").read_text())
    assert state["cleaned"] == {"session": True, "sandbox": True, "verify_sandbox": True, "disks": True}
    assert state["instance"] != state["verify_instance"] and result.tampered == []  # verified in a fresh instance
    table = rows(result)
    assert table and all(r["task_id"] == task_id and r["group_id"] == task_id for r in table)
    assert all(r["reward"] == 1.0 and r["status"] == "completed" and r["weight"] == 1.0 for r in table)
    meta = json.loads(table[0]["metadata"])
    assert meta["task"]["repo"] == task_id.removeprefix("fix-") and meta["task"]["exit_code"] == 0
    assert any(r["num_calls"] >= 2 for r in table)  # the tool call and the answer, merged
    for path in result.capture_files:
        for record in read_capture_dicts(path):
            assert_prompt_faithful(record, tokenizer)


@pytest.mark.slow
def test_broken_verifier_is_an_infrastructure_error(fixed) -> None:
    """A verifier that returns no number is the task's bug, not the agent's: masked, not a zero."""
    cfg, future = fixed[("crash", "pi")]
    result = future.result()
    assert (result.status, result.failure, result.weight) == ("error", "infrastructure", 0.0), diagnose(cfg)
    assert result.reason.startswith("evaluator: ") and "expected a finite number" in result.reason
    table = rows(result)  # the trajectory is kept, masked
    assert all(r["weight"] == 0.0 and r["status"] == "error" and set(r["loss_mask"]) <= {0} for r in table)
    assert "expected a finite number" in json.loads(table[0]["metadata"])["outcome"]["reason"]


@pytest.mark.slow
def test_missing_image_is_an_infrastructure_error(fixed) -> None:
    cfg, future = fixed[("no-image", "pi")]
    result = future.result()
    assert (result.status, result.failure, result.reward, result.weight) == ("error", "infrastructure", None, 0.0)
    assert f"image {cfg.task.image} not found" in result.reason
    assert result.trajectories is None and result.exit_code is None


def polar_run(*args: str, user: list[str] | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    cmd = [*(user or []), sys.executable, "-m", "polar.cli", "run", *args]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=600, env=env)


@pytest.mark.slow
def test_agent_timeout_keeps_the_trajectory(tmp_path, policies_dir, long_model) -> None:
    demo_image()
    task = dataclasses.replace(load_tasks(DEMO)[0], timeout_s=25.0)
    cfg = sample(task, "pi", tmp_path)
    result = run_sample(cfg, EngineConfig(long_model, policy=policies_dir / "loop-shell.yaml"))
    assert (result.status, result.failure, result.reward, result.weight) == ("timeout", "agent_timeout", 0.0, 1.0)
    table = rows(result)
    assert table and all(r["status"] == "timeout" and r["reward"] == 0.0 and r["weight"] == 1.0 for r in table)
    assert any(1 in r["loss_mask"] for r in table)  # trainable
    listed = subprocess.run([str(apptainer_bin()), "instance", "list"], capture_output=True, text=True).stdout
    assert f"polar-{cfg.sample_id}" not in listed


# The interpreter may live under root's private home (pyenv in /root): a private mount namespace shows its
# directory to `nobody` (a tmpfs over /root holding only that directory); nothing changes outside the test.
AS_NOBODY = """set -e
mount --make-rprivate /
if [ -n "$1" ]; then
  d=$(mktemp -d); mount --bind "/root/$1" "$d"; mount -t tmpfs -o mode=755 tmpfs /root
  mkdir "/root/$1"; mount --bind "$d" "/root/$1"
fi
shift
exec runuser -u nobody -- "$@"
"""


def as_nobody() -> list[str]:
    real = Path(os.path.realpath(sys.executable))
    under_root = real.relative_to("/root").parts[0] if real.is_relative_to("/root") else ""
    return ["unshare", "-m", "sh", "-c", AS_NOBODY, "sh", under_root]


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("runuser"), reason="needs root to become nobody")
def test_rootless_as_nobody(policies_dir, tiny_model_dir) -> None:
    """The whole sample as an unprivileged user: Apptainer in user namespaces, the demo sandbox directory."""
    demo_image()
    base = Path(tempfile.mkdtemp(prefix="polar-rootless-"))
    try:
        base.chmod(0o777)
        out = base / "sample"
        env = {"PATH": os.environ["PATH"], "HOME": str(base), "HF_HUB_OFFLINE": "1", "LANG": "C.UTF-8"}
        proc = polar_run("--task", str(DEMO), "--task-id", "fix-wordcount", "--adapter", "pi", "--runtime",
                         "apptainer", "--policy", str(policies_dir / "fix-bug.yaml"), "--model", str(tiny_model_dir),
                         "--out", str(out), "--confdir", str(base / "mitm"), user=as_nobody(), env=env)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "status completed, reward 1, weight 1" in proc.stdout, proc.stdout
        assert (out / "workspace" / "wordcount.py").stat().st_uid == 65534  # the harness ran as nobody
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_stages_run_in_separate_processes(tmp_path, long_model) -> None:
    """Each stage reads the sample's state from its folder: here every stage is its own process (no harness
    runs: the image is missing, so the sample fails in prepare and the later stages carry that through)."""
    from polar.run.sample import prepare_sample
    from polar_mitm.launch import ProxyProcess

    task = dataclasses.replace(load_tasks(DEMO)[0], image=str(tmp_path / "gone.sif"))
    cfg = sample(task, "pi", tmp_path)
    proxy = ProxyProcess("127.0.0.1", 9, 9, tmp_path / "ca.pem", tmp_path / "captures", "open")
    folder = prepare_sample(cfg, EngineConfig(long_model, backend="http://127.0.0.1:9"), proxy)
    for stage in ("run_harness", "evaluate_sample", "postrun_sample"):
        code = f"import sys; from pathlib import Path; from polar.run.sample import {stage}; {stage}(Path(sys.argv[1]))"
        proc = subprocess.run([sys.executable, "-c", code, str(folder)], cwd=ROOT, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
    result = SampleResult.from_dict(json.loads((folder / "result.json").read_text()))
    assert (result.status, result.failure, result.weight) == ("error", "infrastructure", 0.0)
    assert result.reason == f"prepare: SandboxError: apptainer runtime: image {tmp_path / 'gone.sif'} not found"
    stages = ("prepare", "run", "evaluate", "postrun")  # each stage's wall time and host CPU
    assert set(result.timings) == {f"{stage}{unit}" for stage in stages for unit in ("_s", "_cpu_s")}
    assert all(v >= 0 for v in result.timings.values())


def instances() -> str:
    return subprocess.run([str(apptainer_bin()), "instance", "list"], capture_output=True, text=True).stdout


@pytest.mark.slow
def test_sigterm_of_polar_run_stops_the_instance(tmp_path, policies_dir, tiny_model_dir) -> None:
    demo_image()
    out = tmp_path / "term"
    cmd = [sys.executable, "-m", "polar.cli", "run", "--task", str(DEMO), "--task-id", "fix-calc", "--adapter", "pi",
           "--runtime", "apptainer", "--policy", str(policies_dir / "loop-shell.yaml"), "--model", str(tiny_model_dir),
           "--out", str(out), "--confdir", str(tmp_path / "mitm")]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        while not (out / "harness.stdout").exists():  # the harness has started in its instance
            assert proc.poll() is None, proc.communicate()[0]
            time.sleep(0.2)
        name = json.loads((out / "sample.json").read_text())["instance"]
        assert name in instances()
        proc.send_signal(signal.SIGTERM)
        output = proc.communicate(timeout=300)[0]
    finally:
        proc.kill()
    assert proc.returncode == 130 and "interrupted" in output, output
    assert name not in instances()
    cleaned = json.loads((out / "sample.json").read_text())["cleaned"]
    assert cleaned == {"session": True, "sandbox": True, "disks": True}


class Watch:
    """The largest resident set and thread count of this process (the worker) while it runs, sampled."""

    def __init__(self) -> None:
        self.rss, self.threads = self.now()
        self.peak_rss, self.peak_threads = self.rss, self.threads
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._sample, daemon=True)

    @staticmethod
    def now() -> tuple[int, int]:
        with open("/proc/self/status") as f:
            fields = dict(line.split(":", 1) for line in f)
        return int(fields["VmRSS"].split()[0]) * 1024, int(fields["Threads"])

    def _sample(self) -> None:
        while not self.done.wait(0.05):
            rss, threads = self.now()
            self.peak_rss, self.peak_threads = max(self.peak_rss, rss), max(self.peak_threads, threads)

    def __enter__(self) -> Watch:
        self.thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.done.set()
        self.thread.join()


def task_with(tmp_path: Path, files: dict[str, str], sparse: int = 0):
    """fix-calc with its workspace copied to tmp_path plus `files` (and a `sparse`-byte hole as given.bin)."""
    task = load_tasks(DEMO)[0]
    workspace = tmp_path / "task-workspace"
    shutil.copytree(task.workspace, workspace)
    for name, text in files.items():
        (workspace / name).write_text(text)
    if sparse:
        with open(workspace / "given.bin", "wb") as f:
            f.truncate(sparse)
    return dataclasses.replace(task, workspace=workspace)


def run_with_policy(tmp_path: Path, task, command: str, start_reference_server, long_model, redis_url,
                    name: str, reward: float = 1.0, tampered: tuple[str, ...] = ()
                    ) -> tuple[SampleConfig, SampleResult, Watch]:
    """One sample of `task` with pi in Apptainer, whose policy runs `command` and then says "Done."; it must
    complete with `reward`."""
    from tests.polar.scoring.test_reward_hacks import one_command_policy

    demo_image()
    policy = tmp_path / f"{name}.yaml"
    policy.write_text(yaml.safe_dump(one_command_policy(command)))
    backend = start_reference_server(policy, long_model)
    cfg = SampleConfig(task, load_adapter("pi"), tmp_path / "s", name, task.task_id, "apptainer")
    with start_proxy(long_model, backend, tmp_path / "captures", tmp_path / "mitm", tmp_path / "proxy.log",
                     redis_url) as proxy, Watch() as watch:
        result = run_sample(cfg, EngineConfig(long_model, backend=backend), proxy)
    assert (result.status, result.failure, result.reward, result.weight) == ("completed", None, reward, 1.0), (
        result, diagnose(cfg))
    assert result.calls >= 2 and result.tampered == list(tampered)  # the tool call ran, "Done." reached the proxy
    return cfg, result, watch


@pytest.mark.slow
def test_a_64_gib_sparse_file_and_a_fifo_leave_the_reward_and_the_worker_whole(tmp_path, start_reference_server,
                                                                             long_model, redis_url) -> None:
    """Issue 24: the task's workspace holds a 64 GiB sparse file; the agent makes a FIFO and the largest sparse
    file its sandbox allows (RLIMIT_FSIZE refuses 64 GiB there), then fixes the bug. The sample completes with
    reward 1, and this process (the worker: snapshots, verify copy, evaluator) grows by under 200 MB. Issue 40:
    the agent's two are outside `submit: [calc.py]`, dropped and named; the task's own file keeps its holes."""
    task = task_with(tmp_path, {}, sparse=64 * 2**30)
    command = "truncate -s 64G made.bin || truncate -s 4095M made.bin; mkfifo pipe; sed -i 's/a - b/a + b/' calc.py"
    cfg, _, watch = run_with_policy(tmp_path, task, command, start_reference_server, long_model, redis_url,
                                    "sparse-fifo", tampered=("made.bin", "pipe"))
    final = cfg.out / "workspace"
    assert stat.S_ISFIFO(os.lstat(final / "pipe").st_mode)
    assert (final / "made.bin").stat().st_size == 4095 * 2**20 and (final / "given.bin").stat().st_size == 64 * 2**30
    copy = cfg.out / "verify" / "workspace"
    assert not (copy / "pipe").exists() and not (copy / "made.bin").exists()  # dropped, never read
    assert (copy / "given.bin").stat().st_blocks * 512 < 2**20  # the pristine file's holes stay holes
    assert watch.peak_rss - watch.rss < 200 * 2**20, f"the worker grew by {(watch.peak_rss - watch.rss) >> 20} MB"


FLOOD = """import glob, select, socket, time
# The bridge's socket file, as the in-sandbox forwarder was told it: straight to the worker's side, no cap inside.
args = [a for f in glob.glob("/proc/[0-9]*/cmdline") for a in open(f, "rb").read().decode().split("\\0")]
path = next(a.split("=", 1)[1] for a in args if a.endswith("/proxy.sock"))
clients = []
for _ in range(600):
    s = socket.socket(socket.AF_UNIX)
    s.connect(path)
    clients.append(s)
time.sleep(1)
readable = select.select(clients, [], [], 2)[0]
refused = 0
for s in readable:
    try:
        refused += s.recv(1) == b""
    except ConnectionResetError:
        refused += 1
print("refused", refused, "held", 600 - len(readable))
for s in clients:
    s.close()
time.sleep(1)
"""


@pytest.mark.slow
def test_600_connections_to_the_bridge_socket_cost_the_worker_no_threads(tmp_path, start_reference_server,
                                                                        long_model, redis_url) -> None:
    """Issue 24: the agent opens 600 connections to the proxy's socket file at once and holds them. The worker's
    thread count stays put, those beyond the cap are refused, and the harness still reaches the proxy after."""
    from polar.sandbox.bridge import MAX_CONNECTIONS

    task = task_with(tmp_path, {"flood.py": FLOOD})
    command = "python3 flood.py > flood.txt 2>&1; sed -i 's/a - b/a + b/' calc.py"
    cfg, _, watch = run_with_policy(tmp_path, task, command, start_reference_server, long_model, redis_url, "flood",
                                    tampered=("flood.txt",))  # the agent's own log: outside submit, dropped
    words = (cfg.out / "workspace" / "flood.txt").read_text().split()
    assert words[0] == "refused", words
    refused, held = int(words[1]), int(words[3])
    assert held <= MAX_CONNECTIONS and refused >= 600 - MAX_CONNECTIONS and refused + held == 600
    assert watch.peak_threads - watch.threads < 10, f"{watch.peak_threads} threads from {watch.threads}"


@pytest.mark.slow
def test_a_workspace_of_too_many_files_scores_zero(tmp_path, start_reference_server, long_model, redis_url) -> None:
    """More entries than a snapshot walks (the agent made them): not verified, reward 0, trainable."""
    from polar.run.summary import MAX_ENTRIES

    command = f"mkdir many; (cd many && seq {MAX_ENTRIES + 1} | xargs touch); sed -i 's/a - b/a + b/' calc.py"
    _, result, _ = run_with_policy(tmp_path, task_with(tmp_path, {}), command, start_reference_server, long_model,
                                   redis_url, "many-files", reward=0.0)
    assert f"more than {MAX_ENTRIES} entries: reward 0" in result.evaluator_output


def test_rows_the_sessions_content_breaks_are_a_trainable_zero(tmp_path) -> None:
    """Issue 40 item 5: a name the agent chose that is not UTF-8 (a HOME hook, a reward.json key) once broke the
    rows' metadata, and the sample was masked and retried: the agent could choose to be masked. Now such names
    are made printable first, and rows that the session's own content still breaks are completed, reward 0."""
    from polar.run.sample import after_build, printable
    from polar.run.summary import CONTENT_FAILURE, build_trajectories
    from polar_traj.records import CallRecord, append_record

    record = CallRecord("c1", "t", "s", "openai_chat", "m", False, 0.0, 1.0, 1.0, None, (1, 2, 3), (4, 5),
                        (-0.5, -0.5), "stop", "rendered", None,
                        {"model": "m", "messages": [{"role": "user", "content": "hi"}]}, None, None)
    append_record(tmp_path / "captures", record)
    files = sorted((tmp_path / "captures").rglob("*.jsonl"))
    entry = {"session_id": "s", "status": "completed", "reward": 1.0,
             "metadata": {"tampered": ["~/.local/lib/python3.11/site-packages/x\udcff.pth"], "rewards": {"\ud800": 1}}}
    built, error = build_trajectories(files, tmp_path / "a.parquet", [entry])
    assert built is None and error.startswith(CONTENT_FAILURE)  # what postrun saw before
    assert after_build("completed", None, None, 1.0, error) == ("completed", None, error, 0.0)
    assert after_build("completed", None, None, 1.0, "trajectories not built: disk full") == (
        "error", "infrastructure", "trajectories not built: disk full", 1.0)
    clean = {**entry, "metadata": printable(entry["metadata"])}
    assert clean["metadata"]["tampered"] == ["~/.local/lib/python3.11/site-packages/x\\udcff.pth"]
    built, error = build_trajectories(files, tmp_path / "b.parquet", [clean])
    assert error is None and built is not None
