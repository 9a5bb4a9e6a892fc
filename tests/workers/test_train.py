"""`polar train` as a user types it: the whole loop on one machine (a private Redis, the reference server, a
worker node), overlapped with a staleness bound, one line per step, steps.json, and `polar report` of the run
drawing the reward, the importance ratio and the rows by version lag per step."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from polar.cli import main

ROOT = Path(__file__).resolve().parents[2]
STEPS = 4


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    out = tmp_path_factory.mktemp("train") / "run"
    proc = subprocess.run([sys.executable, "-m", "polar.cli", "train", "--steps", str(STEPS), "--groups", "2",
                           "--group-size", "4", "--lr", "0.1", "--overlap", "--max-staleness", "1", "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out, proc


def test_one_line_per_step_and_steps_json(trained):
    out, proc = trained
    lines = [line for line in proc.stdout.splitlines() if re.match(r"step +\d+ ", line)]
    assert len(lines) == STEPS and "IS ratio mean" in lines[0] and "rows by lag" in lines[0]
    steps = json.loads((out / "steps.json").read_text())
    assert [s["step"] for s in steps] == list(range(STEPS))
    assert [s["engine_version"] for s in steps] == [str(i + 1) for i in range(STEPS)]
    assert abs(steps[0]["is_mean"] - 1) <= 1e-4 and steps[0]["rows_per_lag"] == {"0": 8}  # step 0: on-policy
    # overlapped: each step's rows are at most one version behind, within max_staleness 1: nothing masked
    assert all(set(s["rows_per_lag"]) <= {"0", "1"} and s["masked_calls"] == 0 for s in steps)
    assert all(0 <= s["is_capped"] <= 1 and s["is_max"] >= s["is_mean"] for s in steps)
    assert f"charts: polar report {out}" in proc.stdout


def test_report_draws_the_run(trained):
    out, _ = trained
    assert main(["report", str(out)]) == 0
    html = (out / "report.html").read_text()
    for plot in ("reward", "is-ratio", "is-capped", "lags", "time"):
        assert f'data-plot="{plot}"' in html
    assert html.count("<polyline") >= 3 and "http://" not in html.replace("http://www.w3.org/2000/svg", "")


@pytest.mark.parametrize("args, message", [
    (["--group-size", "1"], "--group-size 1: GRPO compares samples in a group"),
    (["--model", "/nonexistent"], "--model /nonexistent: no config.json there"),
    (["--tasks", "/nonexistent.yaml"], "--tasks /nonexistent.yaml: not found"),
    (["--broker", "redis://127.0.0.1:1/0"], "--broker and --engine go together"),
    (["--max-staleness", "-1"], "--max-staleness -1: expected 0 or more"),
])
def test_bad_arguments_get_one_line(args, message, capsys):
    assert main(["train", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("polar train: ") and message in err and len(err.strip().splitlines()) == 1


@pytest.mark.slow
def test_the_reward_rises_on_a_learnable_task(tmp_path):
    """brevity (polar/trl/task.py: 1 - characters / 64), a tasks file as a user brings one, 10 steps: the reward
    the trainer sees rises. Five runs here went from 0.18-0.26 over the first three steps to 0.71-0.98 over the
    last three (four sync, one overlapped); the vowel task rises too, but by 0.09-0.53 in 10 steps, too close to
    noise for a test. Runs differ: at this learning rate one overshot once it was brief (0.21 to 0.94 by step 7,
    then empty answers, reward 0, at steps 8 and 9), another rose slowly (0.24 to 0.50 at steps 7-9). So the test
    asks for the best of the last five steps to be 0.2 above the first three's mean: about three standard
    deviations of a step's mean at the start (eight samples, 0.12-0.30 seen), which a trainer that learns nothing
    does not reach."""
    from polar.trl.task import write_tasks

    tasks, out = write_tasks(tmp_path / "tasks.yaml", 2, kind="brevity"), tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "polar.cli", "train", "--tasks", str(tasks), "--steps", "10",
                           "--groups", "2", "--group-size", "4", "--lr", "0.1", "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rewards = [s["reward_mean"] for s in json.loads((out / "steps.json").read_text())]
    first = sum(rewards[:3]) / 3
    assert max(rewards[-5:]) >= first + 0.2, rewards
