"""Tasks whose files live in their image (issue 43; polar/tasks/image_task.py, polar/sandbox/image_files.py).

fixtures/tbench/word-count is made the way terminal-bench 2 makes its tasks: environment/Dockerfile copies app/
to /app, task.toml says version 2.0 and workdir = "/app". Its oracle scores 1 and a do-nothing solution 0, on
the container engine and on Apptainer (the built image exported once to a root filesystem directory); Pi with
the scripted fix (fixtures/policies/harbor.yaml) scores 1 on both, working in /app; the image's files are
copied out once per image; the task's variables reach the agent's sandbox and the verifier's; a failing
healthcheck is an infrastructure error before the agent starts; the task's artifacts are kept."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from polar.run.sample import SampleResult
from tests.polar.sandbox.test_docker import require_engine

ROOT = Path(__file__).resolve().parents[3]
TASK = ROOT / "fixtures" / "tbench" / "word-count"
POLICY = ROOT / "fixtures" / "policies" / "harbor.yaml"
RUNTIMES = ("docker", "apptainer")


def polar(*args: str, env: dict[str, str] | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "polar.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


def copy_task(tmp: Path, files: dict[str, str] | None = None, name: str = "word-count") -> Path:
    dest = tmp / name
    shutil.copytree(TASK, dest)
    for rel, text in (files or {}).items():
        (dest / rel).write_text(text)
    return dest


@pytest.fixture(scope="module", autouse=True)
def engine():
    engine = require_engine()
    if engine.run(["image", "inspect", "polar-tasks:local"], check=False).returncode != 0:
        pytest.fail("no image polar-tasks:local (make setup imports it: scripts/setup_podman.sh)")
    return engine


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_its_oracle_scores_one_and_doing_nothing_zero(tmp_path, runtime):
    done = polar("run", "--task", str(TASK), "--oracle", "--runtime", runtime, "--out", str(tmp_path / "oracle"))
    assert done.returncode == 0 and f"({runtime}): solve.sh exit 0, reward 1" in done.stdout, \
        done.stdout + done.stderr
    assert "3 passed" in (tmp_path / "oracle" / "evaluator.stdout").read_text()
    idle = copy_task(tmp_path, {"solution/solve.sh": "#!/bin/bash\ntrue\n"})
    done = polar("run", "--task", str(idle), "--oracle", "--runtime", runtime, "--out", str(tmp_path / "idle"))
    assert done.returncode == 1 and f"({runtime}): solve.sh exit 0, reward 0" in done.stdout, \
        done.stdout + done.stderr
    assert "1 failed, 2 passed" in (tmp_path / "idle" / "evaluator.stdout").read_text()  # pytest's own verdict


def test_the_image_files_are_copied_out_once_and_seed_each_workspace(tmp_path, engine):
    cache = tmp_path / "cache"
    for n in (1, 2):
        done = polar("run", "--task", str(TASK), "--oracle", "--runtime", "docker", "--out", str(tmp_path / f"o{n}"),
                     env={"POLAR_IMAGE_CACHE": str(cache)})
        assert done.returncode == 0, done.stdout + done.stderr
    seeds = list(cache.glob("*/workdir-*"))
    assert len(seeds) == 1 and sorted(p.name for p in seeds[0].iterdir()) == ["sample.txt", "wordcount.py"]
    assert 'split(" ")' in (seeds[0] / "wordcount.py").read_text()  # the image's own, untouched by the oracles
    for n in (1, 2):  # each oracle changed its own copy
        assert "text.split()" in (tmp_path / f"o{n}" / "workspace" / "wordcount.py").read_text()


def test_the_task_variables_reach_the_agent_and_the_verifier(tmp_path):
    toml = (TASK / "task.toml").read_text().replace(
        "[environment]", '[polar]\nsubmit = ["greeting.txt"]\n\n[environment]\nenv = { WC_GREETING = "hello" }',
    ).replace("[verifier]", '[verifier]\nenv = { WC_STRICT = "yes" }')
    task = copy_task(tmp_path, {
        "task.toml": toml,
        "solution/solve.sh": '#!/bin/bash\necho "$WC_GREETING:$FOO_FROM_IMAGE" > greeting.txt\n',
        "tests/test.sh": '#!/bin/bash\n[ "$WC_STRICT" = yes ] && [ "$(cat /app/greeting.txt)" = hello:bar ] && '
                         '[ "$FOO_FROM_IMAGE" = bar ] && echo 1 > /logs/verifier/reward.txt\n',
        "environment/Dockerfile": (TASK / "environment" / "Dockerfile").read_text() + "ENV FOO_FROM_IMAGE=bar\n"})
    for test_file in (task / "tests").glob("test_*.py"):
        test_file.unlink()
    for runtime in RUNTIMES:  # the container keeps its image's ENV; the exported root filesystem does not
        done = polar("run", "--task", str(task), "--oracle", "--runtime", runtime, "--out", str(tmp_path / runtime))
        assert done.returncode == 0 and "solve.sh exit 0, reward 1" in done.stdout, done.stdout + done.stderr


@pytest.fixture(scope="module")
def pi_runs(tmp_path_factory, long_model) -> dict[str, tuple[Path, str]]:
    tmp = tmp_path_factory.mktemp("image-task")
    runs = {}
    for runtime in RUNTIMES:  # one after the other: two samples and their engines at once crowd 2 cores
        out = tmp / runtime
        done = polar("run", "--task", str(TASK), "--adapter", "pi", "--runtime", runtime, "--policy", str(POLICY),
                     "--model", str(long_model), "--out", str(out), "--confdir", str(tmp / f"mitm-{runtime}"))
        runs[runtime] = (out, done.stdout + done.stderr)
    return runs


def result_of(out: Path, printed: str) -> SampleResult:
    assert (out / "result.json").is_file(), printed
    return SampleResult.from_dict(json.loads((out / "result.json").read_text()))


@pytest.mark.slow
@pytest.mark.parametrize("runtime", RUNTIMES)
def test_pi_fixes_it_working_in_the_image_workdir(pi_runs, runtime):
    out, printed = pi_runs[runtime]
    result = result_of(out, printed)
    assert (result.status, result.failure, result.reward, result.runtime) == ("completed", None, 1.0, runtime), \
        printed
    assert result.calls >= 2 and result.tampered == [], printed
    # its `sed … wordcount.py` (a relative path) ran in /app: the workspace, seeded from the image, has the fix
    assert "text.split()" in (out / "workspace" / "wordcount.py").read_text()
    assert (out / "workspace" / "sample.txt").read_text() == "the quick brown fox\n"
    assert "text.split()" in (out / "artifacts" / "wordcount.py").read_text()  # Harbor's artifacts, kept
    state = json.loads((out / "sample.json").read_text())
    assert state["task"]["workdir"] == "/app" and state["artifacts"] == ["wordcount.py"]


def test_a_failing_healthcheck_stops_the_sample_before_the_agent(tmp_path, long_model):
    toml = (TASK / "task.toml").read_text().replace("[environment]",
                                                    '[environment]\nhealthcheck = "test -f /app/ready"')
    task = copy_task(tmp_path, {"task.toml": toml})
    out = tmp_path / "out"
    done = polar("run", "--task", str(task), "--adapter", "pi", "--runtime", "docker", "--policy", str(POLICY),
                 "--model", str(long_model), "--out", str(out), "--confdir", str(tmp_path / "mitm"))
    result = result_of(out, done.stdout + done.stderr)
    assert (result.status, result.failure, result.calls) == ("error", "infrastructure", 0), done.stdout
    assert result.reason == "prepare: the task's healthcheck exited 1: ", result.reason
    assert not (out / "harness.stdout").exists()  # the agent never started
