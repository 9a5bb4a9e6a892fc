"""Evaluators (polar/scoring/evaluate.py) in a real Apptainer sandbox of the demo image: exit status, stdout and file
rewards, expected files, python verifiers; whatever cannot give a reward raises EvaluatorCrash."""
from __future__ import annotations

import os
from pathlib import Path
from types import MappingProxyType
from typing import Iterator

import pytest

from polar.scoring import evaluate as evaluate_mod
from polar.scoring import evaluation
from polar.scoring.evaluate import EvaluatorCrash, evaluate
from polar.sandbox.runtime import Mounts, get_runtime
from polar.tasks.task import EvaluatorSpec
from tests.polar.sandbox.test_apptainer import demo_image

SUMMARY = {"task_id": "t1", "exit_code": 0}


@pytest.fixture(scope="module")
def box(tmp_path_factory) -> Iterator:
    base = tmp_path_factory.mktemp("evaluate")
    mounts = Mounts(base / "home", base / "workspace", base / "shared")
    for d in (mounts.home, mounts.workspace, mounts.shared):
        d.mkdir()
    (mounts.workspace / "answer.txt").write_text("42\n")
    sandbox = get_runtime("apptainer").prepare(mounts, image=str(demo_image()))
    yield sandbox
    sandbox.stop()


def score(box, spec: EvaluatorSpec, tmp_path: Path, timeout: float = 30):
    return evaluate(spec, box, box.mounts, tmp_path, SUMMARY, timeout)


@pytest.mark.parametrize("command,reward", [("test -f answer.txt", 1.0), ("grep -q 41 answer.txt", 0.0)])
def test_command_exit_status(box, tmp_path, command: str, reward: float) -> None:
    assert score(box, EvaluatorSpec("command", command=command), tmp_path).reward == reward


def test_command_runs_in_the_sandbox_image(box, tmp_path) -> None:
    spec = EvaluatorSpec("command", command="python3 -c 'import pytest, sys; print(sys.version_info[0])'; pwd")
    result = score(box, spec, tmp_path)
    assert result.reward == 1.0 and result.output.split() == ["3", str(box.mounts.workspace)]


def test_reward_from_stdout_and_file(box, tmp_path) -> None:
    assert score(box, EvaluatorSpec("command", command="echo checking; echo 0.25", reward="stdout"), tmp_path).reward == 0.25
    spec = EvaluatorSpec("command", command="echo 0.75 > r.txt; exit 3", reward="file", reward_file="r.txt")
    result = score(box, spec, tmp_path)
    assert result.reward == 0.75 and result.exit_code == 3


@pytest.mark.parametrize("spec,why", [
    (EvaluatorSpec("command", command="echo not-a-number", reward="stdout"), "not a number"),
    (EvaluatorSpec("command", command="true", reward="file", reward_file="none.txt"), "no none.txt"),
    (EvaluatorSpec("command", command="no-such-verifier --run"), None),  # exit 127: reward exit says 0
    (EvaluatorSpec("command", command="exit 127", reward="stdout"), "exited 127"),
    (EvaluatorSpec("python", python="tests.polar.scoring.task_evaluators:crash"), "raised on the workspace"),
    # a reward out of range or not finite, where the workspace's code could have put it (issue 40 item 5)
    (EvaluatorSpec("command", command="echo 1e308", reward="stdout"), r"reward 1e+308 is outside"),
    (EvaluatorSpec("command", command="echo nan", reward="stdout"), "reward nan is outside"),
    (EvaluatorSpec("command", command="echo 32768 > r.txt", reward="file", reward_file="r.txt"), "reward 32768.0 is"),
    (EvaluatorSpec("python", python="tests.polar.scoring.task_evaluators:seven"), "reward 7.0 is outside"),
])
def test_the_workspaces_failures_score_zero(box, tmp_path, spec: EvaluatorSpec, why: str | None) -> None:
    """What the workspace caused is a reward of 0, never a crash the agent could choose to be masked by."""
    result = score(box, spec, tmp_path)
    assert result.reward == 0.0
    assert why is None or why in result.output
    assert why is None or "outside" not in why or why in (result.unscored or "")  # precheck still sees it


@pytest.mark.parametrize("spec,message", [
    (EvaluatorSpec("python", python="tests.polar.no_such_module:score"), "No module named"),
    (EvaluatorSpec("python", python="tests.polar.scoring.task_evaluators:no_such_function"), "no_such_function"),
    (EvaluatorSpec("python", python="tests.polar.scoring.task_evaluators:no_number"), "expected a finite number"),
])
def test_the_verifiers_own_failures_crash(box, tmp_path, spec: EvaluatorSpec, message: str) -> None:
    with pytest.raises(EvaluatorCrash, match=message):
        score(box, spec, tmp_path)


def test_reward_range_is_the_tasks(box, tmp_path) -> None:
    spec = EvaluatorSpec("command", command="echo 7", reward="stdout")
    assert evaluate(spec, box, box.mounts, tmp_path, SUMMARY, 30, reward_range=(-10.0, 10.0)).reward == 7.0


def test_a_symlinked_reward_file_scores_zero(box, tmp_path) -> None:
    """A reward file that is a link (to a host file, or to a sibling's answer) is never followed: reward 0."""
    host_file = tmp_path / "sibling-reward.txt"
    host_file.write_text("1\n")
    link = box.mounts.workspace / "linked.txt"
    link.symlink_to(host_file)
    try:
        for target in (host_file, Path("/proc/sys/kernel/pid_max")):
            link.unlink()
            link.symlink_to(target)
            spec = EvaluatorSpec("command", command="true", reward="file", reward_file="linked.txt")
            result = score(box, spec, tmp_path)
            assert result.reward == 0.0 and "symlink" in result.output
        files = EvaluatorSpec("files", files=MappingProxyType({"linked.txt": None}))
        assert score(box, files, tmp_path).reward == 0.0
    finally:
        link.unlink()


def test_command_timeout_scores_zero_unless_the_node_is_overloaded(box, tmp_path, monkeypatch) -> None:
    """A verifier that hangs on the workspace's code is reward 0, whatever the load average says (the agent's
    code can raise it); the same timeout while the node runs more sample stages than its bound allows (its own
    count, polar/sandbox/occupancy.py) is the machine's failure."""
    from polar.sandbox import occupancy

    monkeypatch.setattr(occupancy, "FOLDER", tmp_path / "occupancy")
    monkeypatch.setattr(os, "getloadavg", lambda: (1000.0, 1000.0, 1000.0))  # not what decides
    result = score(box, EvaluatorSpec("command", command="sleep 30"), tmp_path, timeout=2)
    assert result.reward == 0.0 and "timed out after 2s" in result.output
    monkeypatch.setenv("POLAR_SLOTS", "1")
    with occupancy.occupying(), occupancy.occupying():
        assert occupancy.running() == 2
        monkeypatch.setattr(evaluation, "OVERLOAD_PER_CORE", 1.0)
        with pytest.raises(EvaluatorCrash, match="timed out after 2s on an overloaded node \\(2 sample stages"):
            score(box, EvaluatorSpec("command", command="sleep 30"), tmp_path, timeout=2)


def test_expected_files(box, tmp_path) -> None:
    ok = EvaluatorSpec("files", files=MappingProxyType({"answer.txt": "42\n"}))
    assert score(box, ok, tmp_path).reward == 1.0
    bad = EvaluatorSpec("files", files=MappingProxyType({"answer.txt": "41\n", "missing.txt": None}))
    result = score(box, bad, tmp_path)
    assert result.reward == 0.0 and result.output.splitlines() == ["differs: answer.txt", "missing: missing.txt"]


def test_python_verifier_gets_workspace_and_summary(box, tmp_path) -> None:
    result = score(box, EvaluatorSpec("python", python="tests.polar.scoring.task_evaluators:half"), tmp_path)
    assert result.reward == 0.5 and "'answer.txt'" in result.output and " t1" in result.output


def test_python_verifier_runs_in_the_sandbox_not_as_root(box, tmp_path) -> None:
    """Issue 40 item 4: a python evaluator runs inside the verify sandbox (its own pid namespace, not the host's
    uid 0), with the workspace off sys.path, so a workspace module named like one it imports is never run."""
    (box.mounts.workspace / "json.py").write_text("import os\nos._exit(0)\n")
    try:
        result = score(box, EvaluatorSpec("python", python="tests.polar.scoring.task_evaluators:where"), tmp_path)
    finally:
        (box.mounts.workspace / "json.py").unlink()
    host_init = Path("/proc/1/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:60]
    assert result.reward == 1.0, result.output
    assert "workspace on sys.path: False" in result.output and f"pid 1: {host_init}\n" not in result.output


def test_huge_output_is_read_by_its_tail(box, tmp_path) -> None:
    """The workspace's code printing 100 MB: the reward on the last line still counts, and the host reads only the
    output's tail (issue 24), not 100 MB."""
    import tracemalloc

    spec = EvaluatorSpec("command", command="head -c 100000000 /dev/zero | tr '\\0' x; echo; echo 0.5",
                         reward="stdout")
    tracemalloc.start()
    try:
        result = score(box, spec, tmp_path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert result.reward == 0.5 and len(result.output) <= evaluate_mod.OUTPUT_LIMIT
    assert peak < 10 * 2**20
