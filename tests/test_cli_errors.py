"""A new user's bad inputs, one table: each case runs the `polar` CLI in a subprocess and must exit non-zero,
without a traceback, with a short message naming what is wrong (the flag, the file or the setting).

No case starts a sandbox or an engine: Redis and engines are unreachable 127.0.0.1 ports, files are made here.
`python tests/test_cli_errors.py` prints clear/not per case (how the closing note of issue 26 was counted)."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(os.environ.get("POLAR_ROOT_UNDER_TEST") or Path(__file__).resolve().parents[1])
MAX_LINES = 3
CASE_TIMEOUT_S = float(os.environ.get("CASE_TIMEOUT_S", "60"))  # generous for a loaded CI; a clear case takes about a second


def dead_port() -> int:
    """A 127.0.0.1 port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


DEAD = f"http://127.0.0.1:{dead_port()}"
DEAD_REDIS = f"redis://127.0.0.1:{dead_port()}/1"
TASKS = str(ROOT / "fixtures" / "tasks" / "tasks.yaml")
POLICY = str(ROOT / "fixtures" / "policies" / "fix-bug.yaml")


@dataclass(frozen=True)
class Case:
    name: str
    argv: tuple[str, ...]  # after `polar`; {tmp} is the case's folder of prepared files
    names: tuple[str, ...]  # each must appear in the message ({tmp} expanded)
    env: dict[str, str] = field(default_factory=dict)
    program: tuple[str, ...] = ("-m", "polar.cli")  # what `python` runs: the polar CLI unless said otherwise


PORTS = ("--proxy-port", str(dead_port()), "--base-url-port", str(dead_port()), "--confdir", "{tmp}/conf")
WORKER = ("-c", "import workers.celery_app")
RUN = ("run", "--adapter", "pi", "--instruction", "hi")
CASES = [
    # no silent model defaults
    Case("run-backend-without-model", RUN + ("--backend", DEAD), ("--model",)),
    Case("run-task-backend-without-model", ("run", "--task", TASKS, "--task-id", "fix-calc", "--adapter", "pi",
                                            "--backend", DEAD),
         ("--model",)),
    Case("proxy-without-tokenizer", ("proxy", "--backend", DEAD, *PORTS), ("--tokenizer",)),
    Case("run-model-missing", RUN + ("--backend", DEAD, "--model", "{tmp}/nomodel"), ("--model", "{tmp}/nomodel")),
    Case("run-model-without-tokenizer", RUN + ("--policy", POLICY, "--model", "{tmp}/empty"), ("--model",)),
    Case("proxy-tokenizer-missing", ("proxy", "--tokenizer", "{tmp}/nomodel", "--backend", DEAD, *PORTS),
         ("{tmp}/nomodel",)),
    # polar run: paths and files
    Case("run-policy-misspelt", RUN + ("--policy", "fixtures/policies/fix-bugg.yaml"), ("--policy", "fix-bugg.yaml")),
    Case("run-policy-malformed", RUN + ("--policy", "{tmp}/bad.yaml"), ("--policy", "bad.yaml")),
    Case("run-workdir-missing", RUN + ("--policy", POLICY, "--workdir", "{tmp}/nowhere"), ("--workdir",)),
    Case("run-adapter-unknown", ("run", "--adapter", "pie", "--instruction", "hi"), ("pie",)),
    Case("run-adapter-malformed", ("run", "--adapter", "{tmp}/bad.yaml", "--instruction", "hi"), ("bad.yaml",)),
    Case("run-adapter-incomplete", ("run", "--adapter", "{tmp}/adapter-incomplete.yaml", "--instruction", "hi"),
         ("adapter-incomplete.yaml",)),
    Case("run-out-not-empty", RUN + ("--policy", POLICY, "--out", "{tmp}/full"), ("{tmp}/full",)),
    Case("run-no-instruction", ("run", "--adapter", "pi"), ("--instruction",)),
    Case("run-task-missing", ("run", "--task", "{tmp}/nowhere.yaml"), ("nowhere.yaml",)),
    Case("run-task-malformed", ("run", "--task", "{tmp}/bad.yaml"), ("bad.yaml",)),
    Case("run-task-no-instruction", ("run", "--task", "{tmp}/task-incomplete.yaml"), ("instruction",)),
    Case("run-task-id-unknown", ("run", "--task", TASKS, "--task-id", "fix-calcc"), ("fix-calcc",)),
    Case("run-task-evaluator-kind", ("run", "--task", "{tmp}/task-bad-evaluator.yaml"), ("evaluator",)),
    Case("run-task-image-missing", ("run", "--task", TASKS, "--task-id", "fix-calc", "--adapter", "pi",
                                    "--policy", POLICY, "--image", "{tmp}/noimage"), ("--image", "{tmp}/noimage")),
    Case("run-oracle-yaml-task", ("run", "--task", TASKS, "--task-id", "fix-calc", "--oracle"),
         ("--oracle", "tasks.yaml", "a Harbor task directory")),  # once an impossible tasks.yaml/fix-calc/… path
    Case("run-proxy-half", RUN + ("--proxy", DEAD), ("--proxy-base-url",)),
    # the workers' commands with Redis unreachable
    Case("submit-redis-down", ("submit", TASKS, "--adapter", "pi", "--broker", DEAD_REDIS), (DEAD_REDIS, "--broker")),
    Case("status-redis-down", ("status", "--broker", DEAD_REDIS), (DEAD_REDIS, "--broker")),
    Case("status-batch-redis-down", ("status", "b-1", "--broker", DEAD_REDIS), (DEAD_REDIS, "--broker")),
    Case("cancel-redis-down", ("cancel", "b-1", "--broker", DEAD_REDIS), (DEAD_REDIS, "--broker")),
    Case("policy-redis-down", ("policy", "status", "--broker", DEAD_REDIS), ("POLAR_SESSIONS",)),
    Case("node-redis-down", ("node", "list", "--broker", DEAD_REDIS), (DEAD_REDIS, "--broker")),
    Case("nodes-redis-down", ("nodes", "--broker", DEAD_REDIS), (DEAD_REDIS, "--broker")),
    Case("batches-redis-down", ("batches", "--broker", DEAD_REDIS), (DEAD_REDIS, "--broker")),
    Case("api-redis-down", ("api", "--broker", DEAD_REDIS, "--port", str(dead_port())), (DEAD_REDIS, "--broker"),
         env={"POLAR_API_TOKEN": "t" * 24}),  # once uvicorn's 55-line startup traceback
    Case("status-env-broker-down", ("status",), ("POLAR_BROKER", DEAD_REDIS), env={"POLAR_BROKER": DEAD_REDIS}),
    Case("submit-tasks-missing", ("submit", "{tmp}/nowhere.yaml", "--broker", DEAD_REDIS), ("nowhere.yaml",)),
    Case("submit-group-size-zero", ("submit", TASKS, "--group-size", "0", "--broker", DEAD_REDIS),
         ("--group-size",)),
    # polar traj
    Case("traj-build-empty", ("traj", "build", "{tmp}/empty", "-o", "{tmp}/out.parquet"), ("{tmp}/empty",)),
    Case("traj-build-missing", ("traj", "build", "{tmp}/nowhere", "-o", "{tmp}/out.parquet"), ("{tmp}/nowhere",)),
    Case("traj-stats-missing", ("traj", "stats", "{tmp}/nowhere.parquet"), ("nowhere.parquet",)),
    Case("traj-stats-not-parquet", ("traj", "stats", "{tmp}/bad.yaml"), ("bad.yaml",)),
    Case("traj-export-missing", ("traj", "export", "{tmp}/nowhere.parquet", "--format", "sft", "-o", "{tmp}/o"),
         ("nowhere.parquet",)),
    # a worker node's settings (what `celery -A workers worker` imports first)
    Case("worker-engine-without-model-dir", (), ("POLAR_ENGINE_URL", "POLAR_MODEL_DIR"), program=WORKER,
         env={"POLAR_ENGINE_URL": DEAD}),
    Case("worker-runtime-unknown", (), ("POLAR_RUNTIME", "kvm"), program=WORKER, env={"POLAR_RUNTIME": "kvm"}),
    Case("worker-engine-unknown", (), ("POLAR_ENGINE", "tgi"), program=WORKER, env={"POLAR_ENGINE": "tgi"}),
    Case("worker-status-interval-bad", (), ("POLAR_STATUS_S", "often"), program=WORKER,
         env={"POLAR_STATUS_S": "often"}),
    Case("worker-proxies-bad", (), ("POLAR_PROXIES", "0"), program=WORKER, env={"POLAR_PROXIES": "0"}),
    Case("worker-proxies-with-proxy", (), ("POLAR_PROXIES", "POLAR_PROXY"), program=WORKER,
         env={"POLAR_PROXIES": "2", "POLAR_PROXY": "http://127.0.0.1:9,http://127.0.0.1:9,/tmp"}),
    # others
    Case("report-missing", ("report", "{tmp}/nowhere"), ("{tmp}/nowhere",)),
    Case("serve-model-missing", ("serve", "--model", "{tmp}/nomodel", "--port", str(dead_port())),
         ("{tmp}/nomodel",)),
    # out-of-range numbers (a port over 65535 was an OverflowError traceback; a negative timeout was waited out)
    Case("serve-port-too-large", ("serve", "--model", "fixtures/tiny-qwen2", "--port", "99999"), ("--port", "99999")),
    Case("api-port-too-large", ("api", "--port", "99999"), ("--port", "99999")),
    Case("run-timeout-negative", RUN + ("--timeout", "-5"), ("--timeout", "-5")),
    Case("node-drain-deadline-negative", ("node", "drain", "n1", "--deadline", "-5"), ("--deadline", "-5")),
]


def prepare(tmp: Path) -> None:
    """The files the cases point at."""
    (tmp / "empty").mkdir()
    (tmp / "full").mkdir()
    (tmp / "full" / "x").write_text("x")
    (tmp / "bad.yaml").write_text("name: [unclosed\n")
    (tmp / "adapter-incomplete.yaml").write_text("name: mine\n")
    (tmp / "task-incomplete.yaml").write_text("task_id: t1\nworkspace: .\nimage: host\n"
                                               "evaluator: {command: 'true'}\n")
    (tmp / "task-bad-evaluator.yaml").write_text("task_id: t1\ninstruction: hi\nworkspace: .\nimage: host\n"
                                                  "evaluator: {kind: magic}\n")
    from polar_traj.pipeline import Selection, build_parquet
    from polar_traj.records import CallRecord, append_record

    for n in range(3):
        append_record(tmp / "caps", CallRecord(
            call_id=f"c{n}", task_id="t", session_id=f"s{n}", api="openai_chat", model="m", stream=False,
            started_at=1.0, ended_at=2.0, latency_ms=1.0, policy_version=1, prompt_ids=(1, 2), output_ids=(3,),
            output_logprobs=(-0.5,), finish_reason="stop", prefix_source="rendered", parent_call_id=None,
            request={"messages": [{"role": "user", "content": "hi"}]}, response=None, error=None))
    build_parquet(Selection(str(tmp / "caps")), str(tmp / "good.parquet"))


def environment(extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("POLAR_")}
    return {**env, "HF_HUB_OFFLINE": "1", "POLAR_BROKER": DEAD_REDIS, **extra}


def problem(case: Case, tmp: Path) -> str | None:
    """None when the case is clear; else what is wrong with its answer."""
    argv = [sys.executable, *case.program, *(a.replace("{tmp}", str(tmp)) for a in case.argv)]
    start = time.monotonic()
    try:
        r = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                           env=environment(case.env), timeout=CASE_TIMEOUT_S, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return f"no answer within {CASE_TIMEOUT_S:g}s"
    took = time.monotonic() - start
    err = r.stderr.strip()
    lines = [line for line in err.splitlines() if line.strip()]
    if r.returncode == 0:
        return f"exit 0 after {took:.1f}s; stderr: {err[-300:]!r}"
    if "Traceback" in err:
        return f"traceback ({len(lines)} lines): {lines[-1][:200] if lines else ''}"
    if len(lines) > MAX_LINES:
        return f"{len(lines)} lines: {err[-300:]!r}"
    missing = [n.replace("{tmp}", str(tmp)) for n in case.names if n.replace("{tmp}", str(tmp)) not in err]
    if missing:
        return f"does not name {missing}: {err[-300:]!r}"
    return None


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("bad-inputs")
    prepare(tmp)
    return tmp


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bad_input_is_one_clear_line(case: Case, files: Path) -> None:
    assert problem(case, files) is None


def test_a_reader_that_leaves_ends_it_cleanly(files: Path) -> None:
    """`polar traj stats … | head` once ended `polar traj stats: error: …: [Errno 32] Broken pipe`, exit 2: now
    nothing on stderr and exit 0, with stdout closed from the start and under `set -o pipefail` with head."""
    stats = [sys.executable, "-m", "polar.cli", "traj", "stats", str(files / "good.parquet")]
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        r = subprocess.run(stats, stdout=write_end, stderr=subprocess.PIPE, text=True, cwd=ROOT, timeout=CASE_TIMEOUT_S)
    finally:
        os.close(write_end)
    assert (r.returncode, r.stderr) == (0, "")
    line = " ".join(f"'{a}'" for a in stats)
    r = subprocess.run(["bash", "-c", f"set -o pipefail; {line} | head -1"], capture_output=True, text=True, cwd=ROOT,
                       timeout=CASE_TIMEOUT_S)
    assert (r.returncode, r.stderr, len(r.stdout.splitlines())) == (0, "", 1)


def test_version_and_help() -> None:
    def polar(*argv: str) -> str:
        return subprocess.run([sys.executable, "-m", "polar.cli", *argv], capture_output=True, text=True, cwd=ROOT,
                              check=True, timeout=CASE_TIMEOUT_S).stdout

    assert polar("--version").startswith("polar 0.")
    assert "--tokenizer" in polar("proxy", "--help") and "example:" in polar("proxy", "--help")
    assert "example:" in polar("traj", "stats", "--help")
    assert "token_level_scores" in polar("traj", "export", "--help")


def test_table_is_large_enough() -> None:
    assert len(CASES) >= 30 and len({c.name for c in CASES}) == len(CASES)


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        prepare(Path(d))
        clear = 0
        for case in CASES:
            why = problem(case, Path(d))
            clear += why is None
            print(f"{'clear' if why is None else 'NOT  '} {case.name}" + (f": {why}" if why else ""), flush=True)
        print(f"{clear}/{len(CASES)} clear")
