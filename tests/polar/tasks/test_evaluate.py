"""Evaluators (polar/tasks/evaluate.py) in a real Apptainer sandbox of the demo image: exit status, stdout and file
rewards, expected files, python verifiers; whatever cannot give a reward raises EvaluatorCrash."""
from __future__ import annotations

from pathlib import Path
from types import MappingProxyType
from typing import Iterator

import pytest

from polar.tasks.evaluate import EvaluatorCrash, evaluate
from polar.sandbox.runtime import Mounts, get_runtime
from polar.tasks.spec import EvaluatorSpec
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


@pytest.mark.parametrize("spec,message", [
    (EvaluatorSpec("command", command="echo not-a-number", reward="stdout"), "not a number"),
    (EvaluatorSpec("command", command="true", reward="file", reward_file="none.txt"), "no reward file none.txt"),
    (EvaluatorSpec("command", command="no-such-verifier --run"), "could not run"),
    (EvaluatorSpec("python", python="tests.polar.tasks.task_evaluators:crash"), "the verifier itself is broken"),
    (EvaluatorSpec("python", python="tests.polar.no_such_module:score"), "No module named"),
])
def test_crashes(box, tmp_path, spec: EvaluatorSpec, message: str) -> None:
    with pytest.raises(EvaluatorCrash, match=message):
        score(box, spec, tmp_path)


def test_command_timeout_is_a_crash(box, tmp_path) -> None:
    with pytest.raises(EvaluatorCrash, match="timed out after 2s"):
        score(box, EvaluatorSpec("command", command="sleep 30"), tmp_path, timeout=2)


def test_expected_files(box, tmp_path) -> None:
    ok = EvaluatorSpec("files", files=MappingProxyType({"answer.txt": "42\n"}))
    assert score(box, ok, tmp_path).reward == 1.0
    bad = EvaluatorSpec("files", files=MappingProxyType({"answer.txt": "41\n", "missing.txt": None}))
    result = score(box, bad, tmp_path)
    assert result.reward == 0.0 and result.output.splitlines() == ["differs: answer.txt", "missing: missing.txt"]


def test_python_verifier_gets_workspace_and_summary(box, tmp_path) -> None:
    result = score(box, EvaluatorSpec("python", python="tests.polar.tasks.task_evaluators:half"), tmp_path)
    assert result.reward == 0.5 and "'answer.txt'" in result.output and result.output.endswith(" t1")
