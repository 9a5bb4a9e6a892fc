"""SWE-style instances (issue 43, polar/tasks/swe.py): fixtures/swe/instances.jsonl, three SWE-bench shaped
instances of a small repository with three real bugs and their fixing commits (scripts/make_swe_fixtures.py,
kept as a git bundle). The gold patch scores 1, no change 0, and a patch that fixes FAIL_TO_PASS but breaks a
PASS_TO_PASS test 0; so does an agent that edits the failing test instead of the code (the test patch's files
are staged over its work). Malformed instances are one line naming file, line and field."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from polar.scoring.oracle import run_oracle
from polar.tasks.load import load_tasks
from polar.tasks.task import TaskError
from tests.polar.tasks.test_harbor import polar

ROOT = Path(__file__).resolve().parents[3]
INSTANCES = ROOT / "fixtures" / "swe" / "instances.jsonl"


@pytest.fixture(scope="module")
def tasks(tmp_path_factory):
    return {t.task_id: t for t in load_tasks(INSTANCES)}


def test_the_instances_read_as_tasks_at_their_base_commit(tasks):
    assert sorted(tasks) == ["statslib-1", "statslib-2", "statslib-3"]
    one = tasks["statslib-1"]
    assert one.instruction.startswith("mean() of [1, 2] returns 1")
    assert one.evaluator.kind == "pytest" and one.evaluator.pytest == (
        "tests/test_stats.py::test_mean_is_not_rounded", "tests/test_stats.py::test_mean_of_equal_numbers",
        "tests/test_stats.py::test_median_of_odd_length")
    assert "sum(xs) // len(xs)" in (one.workspace / "statslib" / "stats.py").read_text()  # the bug, unfixed
    assert "test_mean_is_not_rounded" not in (one.workspace / "tests" / "test_stats.py").read_text()
    assert "test_mean_is_not_rounded" in (one.tests / "tests" / "test_stats.py").read_text()  # the test patch's
    log = subprocess.run(["git", "-C", str(one.workspace), "log", "--all", "--format=%s"], capture_output=True,
                         text=True, check=True).stdout.splitlines()
    assert log == ["base 42f36f544a82"]  # one commit of its own: the fixing commits are not in the workspace
    assert json.loads(json.dumps(one.metadata["swe"]))["base_commit"].startswith("42f36f544a82")


@pytest.mark.parametrize("task_id", ["statslib-1", "statslib-2", "statslib-3"])
def test_the_gold_patch_scores_one(tmp_path, task_id):
    done = polar("run", "--task", str(INSTANCES), "--task-id", task_id, "--oracle", "--runtime", "bwrap",
                 "--out", str(tmp_path / "oracle"))
    assert done.returncode == 0 and "solve.sh exit 0, reward 1" in done.stdout, done.stdout + done.stderr


SOLUTIONS = {  # statslib-1: what the work does -> the reward
    "no change": ("true", 0.0),
    "the fix": ("sed -i 's|sum(xs) // len(xs)|sum(xs) / len(xs)|' statslib/stats.py", 1.0),
    "the fix, breaking a PASS_TO_PASS test": ("sed -i 's|sum(xs) // len(xs)|sum(xs) / len(xs)|; "
                                              "s|return s\\[len(s) // 2\\]|return s[0]|' statslib/stats.py", 0.0),
    "the failing test edited instead": ("sed -i 's|== 1.5|== 1|' tests/test_stats.py 2>/dev/null; "
                                        "printf 'def test_mean_is_not_rounded():\\n    pass\\n' >> "
                                        "tests/test_stats.py", 0.0),
}


@pytest.mark.parametrize("what", SOLUTIONS)
def test_only_every_listed_test_passing_scores(tmp_path, tasks, what):
    script, reward = SOLUTIONS[what]
    solve = tmp_path / "solution" / "solve.sh"
    solve.parent.mkdir()
    solve.write_text(f"#!/bin/bash\n{script}\n")
    result = run_oracle(tasks["statslib-1"], solve, "bwrap", tmp_path / "out")
    assert result.exit_code == 0 and result.evaluation.reward == reward, result.evaluation.output


@pytest.mark.parametrize("change, message", [
    (lambda i: i.pop("FAIL_TO_PASS"), ":1: FAIL_TO_PASS: missing"),
    (lambda i: i.update(FAIL_TO_PASS="[]"), ":1: FAIL_TO_PASS: empty"),
    (lambda i: i.update(FAIL_TO_PASS='["test_stats.py"]'), ":1: FAIL_TO_PASS: 'test_stats.py': expected a pytest id"),
    (lambda i: i.update(repo="owner/statslib"), ":1: repo: owner/statslib: not a local git repository"),
    (lambda i: i.update(base_commit="0" * 40), ":1: base_commit: 0000000000000000000000000000000000000000: not a "
                                               "commit"),
    (lambda i: i.update(test_patch="--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+b\n"), ":1: test_patch: does not apply"),
])
def test_a_malformed_instance_is_one_line(tmp_path, change, message):
    instance = json.loads(INSTANCES.read_text().splitlines()[0])
    change(instance)
    (tmp_path / "statslib.bundle").write_bytes((INSTANCES.parent / "statslib.bundle").read_bytes())
    bad = tmp_path / "instances.jsonl"
    bad.write_text(json.dumps(instance) + "\n")
    with pytest.raises(TaskError) as e:
        load_tasks(bad)
    assert str(e.value).startswith(f"{bad}{message}") and "\n" not in str(e.value), e.value
