"""The verifier is checked before it is trusted (polar/scoring/precheck.py): on the untouched workspace in a bwrap
verify sandbox of the host; a verifier that produces no reward at all makes the task's samples infrastructure
errors (end to end through `polar run --task`), never a silent 0."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from polar.scoring import precheck
from polar.scoring.evaluate import Evaluation
from polar.scoring.precheck import check_verifier, unscorable
from polar.tasks.task import EvaluatorSpec, TaskSpec

ROOT = Path(__file__).resolve().parents[3]
CALC = ROOT / "fixtures" / "tasks" / "calc"


def task(command: str, reward: str = "exit", task_id: str = "t1") -> TaskSpec:
    return TaskSpec(task_id, "fix it", CALC, "host", None,
                    EvaluatorSpec("command", command=command, reward=reward, timeout_s=30))


@pytest.mark.parametrize("command, reward, reason", [
    ("python3 -I -m no_such_tool -q", "exit", "/usr/bin/python3: No module named no_such_tool"),
    ("no-such-command --run", "exit", "exited 127"),
    ("kill -9 $$", "exit", "killed by signal 9"),
    ("echo checking", "stdout", "is not a number"),
    ("true", "file", "reward.txt"),
])
def test_a_verifier_without_a_reward_is_named(tmp_path, command: str, reward: str, reason: str) -> None:
    problem = check_verifier(task(command, reward, f"t-{abs(hash(command))}"), "bwrap", tmp_path / "check")
    assert problem is not None and reason in problem.reason, problem
    assert not (tmp_path / "check").exists()  # its scratch is removed


@pytest.mark.parametrize("command, line", [
    # a task file without `tests:`: the body's pytest finds no test in the workspace
    ("python3 -I -m pytest -q -p no:cacheprovider", "the task's verifier ran no test on the untouched workspace "
     "(no tests ran in {t}s, exit 5): it would check nothing; give the task its tests (`tests:`) and name them"),
    ("python3 -I -m pytest -q -p no:cacheprovider tests/test_calc.py", "the task's verifier ran no test on the "
     "untouched workspace (ERROR: file or directory not found: tests/test_calc.py, exit 4): it would check nothing; "
     "give the task its tests (`tests:`) and name them"),
    ("python3 -I -m unittest", "the task's verifier ran no test on the untouched workspace (Ran 0 tests in {t}s, "
     "exit 0): it would check nothing; give the task its tests (`tests:`) and name them"),
])
def test_a_verifier_that_runs_no_test_is_refused(tmp_path, command: str, line: str) -> None:
    """Scored 0 (or 1) for every sample whatever the agent did, once: now refused by the pre-check in one line."""
    problem = check_verifier(task(command, task_id=f"none-{abs(hash(command))}"), "bwrap", tmp_path / "check")
    assert problem is not None, "a verifier that ran no test was trusted"
    time = re.search(r"in (\d+\.\d+)s", problem.reason)
    assert problem.reason == line.format(t=time.group(1) if time else "?")


def test_an_empty_tests_folder_is_refused(tmp_path) -> None:
    (tmp_path / "tests" / "sub").mkdir(parents=True)
    spec = TaskSpec("empty-tests", "fix it", CALC, "host", None,
                    EvaluatorSpec("command", command="python3 -m pytest -q", reward="exit", timeout_s=30),
                    tests=tmp_path / "tests")
    problem = check_verifier(spec, "bwrap", tmp_path / "check")
    assert problem is not None and problem.reason == (
        f"tests: {tmp_path / 'tests'} holds no file: the task's verifier would check nothing")


@pytest.mark.parametrize("command, reward", [("exit 1", "exit"), ("echo 0", "stdout"), ("grep -q x calc.py", "exit"),
                                             ("false && echo 1 > reward.txt", "file")])  # no file: its own 0
def test_a_zero_on_the_untouched_workspace_is_a_reward(tmp_path, command: str, reward: str) -> None:
    assert check_verifier(task(command, reward, f"ok-{abs(hash(command))}"), "bwrap", tmp_path / "c") is None


def test_checked_once_per_task_and_image(tmp_path, monkeypatch) -> None:
    runs: list[str] = []
    monkeypatch.setattr(precheck, "_run_check", lambda t, r, s: runs.append(t.image))
    t = task("exit 0", task_id="cached")
    for _ in range(3):
        check_verifier(t, "bwrap", tmp_path)
    check_verifier(TaskSpec("cached", "fix it", CALC, str(tmp_path), None, t.evaluator), "bwrap", tmp_path)
    assert runs == ["host", str(tmp_path)]


def test_unscorable_reads_the_evaluation() -> None:
    assert unscorable(Evaluation(0.0, "1 failed", 1)) is None
    assert unscorable(Evaluation(0.0, "x", 1, "reward.txt is not a number")) == "reward.txt is not a number"
    assert "No module named pytest" in unscorable(Evaluation(0.0, "/usr/bin/python3.11: No module named pytest\n", 1))
    assert unscorable(Evaluation(0.0, "E   ModuleNotFoundError: No module named 'calc'", 1)) is None  # the bug


@pytest.mark.slow
def test_polar_run_masks_a_task_whose_verifier_lacks_its_tool(tmp_path) -> None:
    """The README's false zero: the harness fixed the bug, but the evaluator's python has no such module."""
    tasks = tmp_path / "tasks.yaml"
    tasks.write_text(f"task_id: fix-calc-notool\ninstruction: Fix the bug in calc.py.\nworkspace: {CALC}\n"
                     f"tests: {ROOT / 'fixtures' / 'tasks' / 'tests' / 'calc'}\nimage: host\n"
                     "evaluator: {command: python3 -I -m no_such_tool -q, timeout_s: 60}\n")
    r = subprocess.run([sys.executable, "-m", "polar.cli", "run", "--task", str(tasks), "--adapter", "pi",
                        "--policy", str(ROOT / "fixtures" / "policies" / "fix-bug.yaml"), "--runtime", "bwrap",
                        "--out", str(tmp_path / "out"), "--confdir", str(tmp_path / "mitm")],
                       capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "status error (infrastructure), reward none, weight 0" in r.stdout
    assert "produces no reward on the untouched workspace" in r.stdout
    assert "/usr/bin/python3: No module named no_such_tool" in r.stdout
