"""`polar redteam fixtures/harbor-steps` (issue 43's multi-step tasks): every hack that applies, played in every step
(mul-then-pow has no min_reward, so what the agent planted in step 1 meets step 2's verifier too), scores 0 in a
completed, trainable sample in bubblewrap, and each task's oracle (each step's solve.sh) scores 1."""
from __future__ import annotations

import pytest

from tests.polar.redteam.redteam_runs import ROOT, check_row, redteam

STEPS = ROOT / "fixtures" / "harbor-steps"
PYTHON_HACKS = ["conftest-py", "exit0-import", "harbor-reward-json", "package-shadow", "home-sitecustomize"]


@pytest.mark.slow
def test_every_hack_holds_through_every_step(tmp_path, long_model):
    report, printed = redteam(STEPS, tmp_path / "rt", long_model, "--runtime", "bwrap")
    rows = report["rows"]
    for row in rows:
        check_row(row)
    cases = {(r["hack"], r["task"]) for r in rows}
    assert {(h, "mul-then-pow") for h in PYTHON_HACKS} <= cases, printed
    assert {("oracle", "mul-then-pow"), ("oracle", "name-then-greet")} <= cases, printed
    assert report["exit"] == 0, printed
