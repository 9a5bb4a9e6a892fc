"""`polar tasks check` (polar/scoring/check.py): every shipped task set scores right as shipped (each oracle the top
reward with nothing dropped, doing nothing the bottom one), and a task set that drops honest work or pays for
none is a miss, named, with exit 1. Real sandboxes; fixtures/tbench's check runs in tests/polar/tasks/test_tbench.py
(it needs the container engine)."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.polar.sandbox.test_apptainer import demo_image

ROOT = Path(__file__).resolve().parents[3]


def check(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "polar.cli", "tasks", "check", *args, "--json"], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("dataset, runtime, size", [
    ("fixtures/harbor", "bwrap", 3), ("fixtures/harbor-steps", "bwrap", 2), ("fixtures/swe/instances.jsonl", "bwrap", 3),
    ("fixtures/tasks/tasks.yaml", "apptainer", 3)])
def test_every_shipped_task_set_scores_right(tmp_path, dataset, runtime, size) -> None:
    if runtime == "apptainer":
        demo_image()
    done = check(dataset, "--runtime", runtime, "--out", str(tmp_path / "out"))
    assert done.returncode == 0, done.stdout + done.stderr
    rows = json.loads(done.stdout)
    assert len(rows) == size and all(r["verdict"] == "ok" for r in rows), rows
    assert all((r["oracle"], r["dropped"], r["nothing"]) == (1.0, [], 0.0) for r in rows), rows
    result = json.loads(next((tmp_path / "out").glob("*/oracle/result.json")).read_text())
    assert (result["status"], result["reward"], result["weight"]) == ("completed", 1.0, 1.0)


def test_a_task_set_that_drops_honest_work_or_pays_for_none_misses(tmp_path) -> None:
    dataset = tmp_path / "set"
    for name in ("write-hello", "count-lines"):
        shutil.copytree(ROOT / "fixtures" / "harbor" / name, dataset / name)
    with (dataset / "write-hello" / "task.toml").open("a") as f:
        f.write('\n[polar]\nsubmit = ["other.txt"]\n')  # the task's own allowlist leaves the answer out
    (dataset / "count-lines" / "tests" / "test.sh").write_text("#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n")
    done = check(str(dataset), "--runtime", "bwrap", "--out", str(tmp_path / "out"))
    assert done.returncode == 1, done.stdout + done.stderr
    rows = {r["task"]: r for r in json.loads(done.stdout)}
    hello, count = rows["write-hello"], rows["count-lines"]
    assert (hello["verdict"], hello["oracle"], hello["dropped"]) == ("MISS", 0.0, ["hello.txt"])
    assert 'hello.txt dropped: not in this task\'s allowlist; add [polar] submit = ["hello.txt"]' in hello["why"]
    assert (count["verdict"], count["nothing"]) == ("MISS", 1.0) and "doing nothing scored 1" in count["why"]
    assert "polar tasks check: 0 of 2 tasks scored right" in done.stderr
