"""Scored samples in the container runtime (issue 29): the demo task with real harnesses (the node CLI pi, and
codex) through `polar run --task --runtime docker`, the real proxy and reference server: the fixing policy scores
1, the non-fixing one 0 (with the image named by its tag, polar-tasks:local, as make setup imports it); and no
container is left after a normal end, an agent timeout or a SIGTERM of `polar run`."""
from __future__ import annotations

import dataclasses
import json
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from polar.harness.adapters import load_adapter
from polar.run.sample import SampleConfig, SampleResult, run_sample
from polar.run.session import EngineConfig
from polar.tasks.load import load_tasks
from polar_traj import read as read_trajectories
from tests.polar.sandbox.test_apptainer import demo_image
from tests.polar.sandbox.test_docker import names, require_engine

ROOT = Path(__file__).resolve().parents[3]
DEMO = ROOT / "fixtures" / "tasks" / "tasks.yaml"
RUNS = {  # name -> (harness, policy, extra arguments, reward)
    "fix-pi": ("pi", "fix-bug.yaml", [], 1.0),
    "fix-codex": ("codex", "fix-bug.yaml", [], 1.0),
    "no-fix-pi": ("pi", "no-fix.yaml", ["--image", "polar-tasks:local"], 0.0),
}


def polar_run(tmp: Path, name: str, policies: Path, model: Path) -> tuple[Path, str]:
    harness, policy, extra, _ = RUNS[name]
    out = tmp / name
    proc = subprocess.run([sys.executable, "-m", "polar.cli", "run", "--task", str(DEMO), "--task-id", "fix-calc",
                           "--adapter", harness, "--runtime", "docker", *extra, "--policy", str(policies / policy),
                           "--model", str(model), "--out", str(out), "--confdir", str(tmp / f"mitm-{name}")],
                          capture_output=True, text=True, cwd=ROOT, timeout=600)
    return out, proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def runs(tmp_path_factory, policies_dir, long_model) -> dict[str, tuple[Path, str]]:
    require_engine()
    demo_image()
    tmp = tmp_path_factory.mktemp("docker-samples")
    with ThreadPoolExecutor(3) as pool:
        return dict(zip(RUNS, pool.map(lambda n: polar_run(tmp, n, policies_dir, long_model), RUNS)))


@pytest.mark.slow
@pytest.mark.parametrize("name", RUNS)
def test_reward_in_the_container_runtime(runs, name: str) -> None:
    out, printed = runs[name]
    reward = RUNS[name][3]
    assert (out / "result.json").is_file(), printed
    result = SampleResult.from_dict(json.loads((out / "result.json").read_text()))
    assert (result.status, result.failure, result.reward, result.weight) == ("completed", None, reward, 1.0), printed
    assert result.runtime == "docker" and result.calls >= 2, printed
    assert ("1 passed" if reward else "1 failed") in result.evaluator_output
    assert f"status completed, reward {reward:g}, weight 1, harness exit 0" in printed, printed
    assert ("1 passed" if reward else "1 failed") in printed  # the evaluator's output is printed
    rows = read_trajectories(result.trajectories).to_pylist()
    assert rows and all(r["reward"] == reward and r["weight"] == 1.0 for r in rows)
    state = json.loads((out / "sample.json").read_text())
    assert state["cleaned"] == {"session": True, "sandbox": True, "verify_sandbox": True, "disks": True}
    assert state["instance"] != state["verify_instance"]  # verified in a fresh container
    assert not {state["instance"], state["verify_instance"]} & names(require_engine())  # both removed


@pytest.mark.slow
def test_agent_timeout_leaves_no_container(tmp_path, policies_dir, long_model) -> None:
    engine = require_engine()
    demo_image()
    task = dataclasses.replace(load_tasks(DEMO)[0], timeout_s=20.0)
    cfg = SampleConfig(task, load_adapter("pi"), tmp_path / "timeout", "timeout-docker", task.task_id, "docker")
    result = run_sample(cfg, EngineConfig(long_model, policy=policies_dir / "loop-shell.yaml"))
    assert (result.status, result.failure, result.reward, result.weight) == ("timeout", "agent_timeout", 0.0, 1.0)
    state = json.loads((cfg.out / "sample.json").read_text())
    assert state["instance"] and state["instance"] not in names(engine)


@pytest.mark.slow
def test_sigterm_of_polar_run_removes_the_container(tmp_path, policies_dir, tiny_model_dir) -> None:
    engine = require_engine()
    demo_image()
    out = tmp_path / "term"
    cmd = [sys.executable, "-m", "polar.cli", "run", "--task", str(DEMO), "--task-id", "fix-calc", "--adapter", "pi",
           "--runtime", "docker", "--policy", str(policies_dir / "loop-shell.yaml"), "--model", str(tiny_model_dir),
           "--out", str(out), "--confdir", str(tmp_path / "mitm")]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        while not (out / "harness.stdout").exists():  # the harness has started in its container
            assert proc.poll() is None, proc.communicate()[0]
            time.sleep(0.2)
        name = json.loads((out / "sample.json").read_text())["instance"]
        assert name in names(engine)
        proc.send_signal(signal.SIGTERM)
        output = proc.communicate(timeout=300)[0]
    finally:
        proc.kill()
    assert proc.returncode == 130 and "interrupted" in output, output
    assert name not in names(engine)
    cleaned = json.loads((out / "sample.json").read_text())["cleaned"]
    assert cleaned == {"session": True, "sandbox": True, "disks": True}
