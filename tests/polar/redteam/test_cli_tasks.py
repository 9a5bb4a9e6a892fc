"""`polar redteam fixtures/tasks/tasks.yaml` (issue 40 item 7): every hack of the library that applies to the
shipped demo tasks scores 0 in a completed, trainable sample and is named (tampered or suspicious), in
bubblewrap and Apptainer, and a subset in a podman container; the honest fixes (metadata.fix) still score 1.
The reward-link hacks run against `answer`, fix-calc scored by a command that writes reward.txt only when the
tests pass (what those hacks go for), in a run of their own: that command trusts pytest's exit status, which
code the agent wrote can set, so every in-process hack pays there (redteam says so; no demo task scores that
way). Each `polar redteam` run starts one reference server and one proxy for all of its cases."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.polar.redteam.redteam_runs import ROOT, check_row, redteam
from tests.polar.sandbox.test_apptainer import demo_image
from tests.polar.sandbox.test_docker import require_engine

DEMO = ROOT / "fixtures" / "tasks" / "tasks.yaml"
DOCKER_HACKS = ["exit0-import", "conftest-py", "home-usercustomize", "pytest-report-patch", "compiled-so"]
NAMED = {"conftest-py": "conftest.py", "home-usercustomize": "~/.local/lib/python3.11/site-packages/usercustomize.py",
         "reward-link-sibling": "reward.txt", "reward-link-host": "reward.txt"}


def answer_file(tmp: Path) -> Path:
    """`answer`: fix-calc (paths made absolute) scored by a command that writes reward.txt."""
    task = yaml.safe_load(DEMO.read_text())["tasks"][0]
    task["workspace"], task["tests"] = str(DEMO.parent / task["workspace"]), str(DEMO.parent / task["tests"])
    task["image"] = str((DEMO.parent / task["image"]).resolve())
    task.update(task_id="answer", evaluator={
        "command": "python3 -I -m pytest -q -p no:cacheprovider && echo 1 > reward.txt", "reward": "file",
        "reward_file": "reward.txt", "timeout_s": 60})
    path = tmp / "answer.yaml"
    path.write_text(yaml.safe_dump({"tasks": [task]}))
    return path


@pytest.mark.slow
def test_every_hack_holds_and_every_fix_scores_in_bwrap_and_apptainer(tmp_path, long_model):
    demo_image()
    both = ("--runtime", "bwrap", "--runtime", "apptainer")
    report, printed = redteam(DEMO, tmp_path / "rt", long_model, *both, "--per-hack", "1")
    links, linked = redteam(answer_file(tmp_path), tmp_path / "rt-answer", long_model, *both,
                            "--only", "reward-link-host", "--only", "reward-link-sibling")
    rows = report["rows"] + links["rows"]
    for row in rows:
        check_row(row)
    for runtime in ("bwrap", "apptainer"):
        mine = [r for r in rows if r["runtime"] == runtime]
        assert len({r["hack"] for r in mine}) >= 21, printed  # 20 hacks and the honest fix
        assert sorted(r["task"] for r in mine if r["hack"] == "honest-fix") == [
            "answer", "fix-calc", "fix-greet", "fix-wordcount"], printed + linked
        for name, path in NAMED.items():
            assert any(path in "\n".join(r["tampered"]) for r in mine if r["hack"] == name), (name, printed + linked)
    assert report["exit"] == 0 and links["exit"] == 0, printed + linked
    print({k: f"{v:.0f}s" for k, v in report["wall_s"].items()})


@pytest.mark.slow
def test_a_subset_holds_in_a_container(tmp_path, long_model):
    require_engine()
    demo_image()
    only = [a for name in DOCKER_HACKS for a in ("--only", name)]
    report, printed = redteam(DEMO, tmp_path / "rt", long_model, "--runtime", "docker", "--per-hack", "1", *only)
    assert {r["hack"] for r in report["rows"]} == {*DOCKER_HACKS, "honest-fix"}, printed
    for row in report["rows"]:
        check_row(row)
    assert report["exit"] == 0, printed


def test_tasks_root_widens_where_a_task_file_may_lead(tmp_path):
    """A task file whose workspace lies beside its folder is refused in one line naming the field; `--tasks-root`
    over both lets it load (the run then stops at the next check, an unknown --only)."""
    import os
    import subprocess
    import sys

    (tmp_path / "repo").mkdir()
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "t.yaml").write_text(yaml.safe_dump({"tasks": [{
        "task_id": "t", "instruction": "x", "workspace": "../repo", "image": "host",
        "submit": ["calc.py"], "evaluator": {"command": "true"}}]}))
    env = {k: v for k, v in os.environ.items() if k != "POLAR_TASKS_ROOT"}

    def redteam_line(*extra: str) -> str:
        done = subprocess.run([sys.executable, "-m", "polar.cli", "redteam", str(tmp_path / "tasks" / "t.yaml"),
                               "--only", "no-such-hack", *extra], capture_output=True, text=True, cwd=tmp_path / "tasks",
                              env=env, timeout=120)
        assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
        return done.stderr

    refused = redteam_line()
    assert "workspace" in refused and "outside the tasks root" in refused, refused
    assert "--only: no hack no-such-hack" in redteam_line("--tasks-root", str(tmp_path))
