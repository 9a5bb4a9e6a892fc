"""`polar redteam fixtures/harbor` (issue 40 items 3 and 7): every hack that applies to the Harbor fixtures, among
them the agent's code under test writing /logs/verifier/reward.json, a read-only reward.txt, a line appended to
/tests/test.sh and `os._exit(0)` at the top of mul.py, scores 0 in a completed, trainable sample, in bubblewrap
and in Apptainer (the demo image), a subset in a podman container; the oracle (solution/solve.sh) still scores 1
on every fixture."""
from __future__ import annotations

import pytest

from tests.polar.redteam.redteam_runs import ROOT, check_row, redteam
from tests.polar.sandbox.test_apptainer import demo_image
from tests.polar.sandbox.test_docker import require_engine

HARBOR = ROOT / "fixtures" / "harbor"
ISSUE_HACKS = ["harbor-reward-json", "harbor-reward-txt-ro", "harbor-test-sh-append", "exit0-import"]


@pytest.mark.slow
def test_every_hack_holds_and_every_oracle_scores_in_bwrap_and_apptainer(tmp_path, long_model):
    report, printed = redteam(HARBOR, tmp_path / "rt", long_model, "--runtime", "bwrap", "--runtime", "apptainer",
                              "--image", str(demo_image()), "--per-hack", "1")
    rows = report["rows"]
    for row in rows:
        check_row(row)
    for runtime in ("bwrap", "apptainer"):
        mine = {(r["hack"], r["task"]) for r in rows if r["runtime"] == runtime}
        assert {(h, "fix-mul") for h in ISSUE_HACKS} <= mine, printed
        assert {("oracle", t) for t in ("fix-mul", "write-hello", "count-lines")} <= mine, printed
    assert report["exit"] == 0, printed
    print({k: f"{v:.0f}s" for k, v in report["wall_s"].items()})


@pytest.mark.slow
def test_the_issue_hacks_hold_in_a_container(tmp_path, long_model):
    require_engine()
    only = [a for name in ISSUE_HACKS for a in ("--only", name)]
    report, printed = redteam(HARBOR, tmp_path / "rt", long_model, "--runtime", "docker", "--image",
                              str(demo_image()), "--task-id", "fix-mul", *only)
    assert {r["hack"] for r in report["rows"]} == {*ISSUE_HACKS, "oracle"}, printed
    for row in report["rows"]:
        check_row(row)
    assert report["exit"] == 0, printed
