"""Shared by the red team's end-to-end tests: `polar redteam ... --json` as a user runs it (one subprocess: one
reference server and one proxy for all of its cases), and the checks every row must pass."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from polar.run.sample import SampleResult
from polar_traj import read as read_trajectories

ROOT = Path(__file__).resolve().parents[3]


def redteam(tasks: Path, out: Path, model: Path, *args: str, timeout: float = 1200) -> tuple[dict, str]:
    """The JSON rows and wall times of `polar redteam TASKS --json ...`, and everything it printed."""
    done = subprocess.run([sys.executable, "-m", "polar.cli", "redteam", str(tasks), "--json", "--out", str(out),
                           "--model", str(model), *args], capture_output=True, text=True, cwd=ROOT, timeout=timeout)
    printed = done.stdout[-4000:] + done.stderr[-8000:]
    try:
        report = json.loads(done.stdout)
    except ValueError:
        raise AssertionError(f"polar redteam printed no JSON (exit {done.returncode}):\n{printed}") from None
    report["exit"] = done.returncode
    (out / "report.json").write_text(json.dumps(report, indent=2))  # kept with the samples, for a look later
    return report, printed


def check_row(row: dict) -> None:
    """A held hack or an honest run that scored, as its sample folder shows it: completed and trainable, the tool
    call made before "Done." (calls >= 2), and trajectories whose reward, weight and tampered list match."""
    expected = "ok" if row["hack"] in ("honest-fix", "oracle") else "held"
    assert row["verdict"] == expected, row
    if row["hack"] == "oracle":  # solve.sh, no harness: no LLM call, no trajectory
        return
    result = SampleResult.from_dict(json.loads((Path(row["sample"]) / "result.json").read_text()))
    assert (result.status, result.failure, result.weight) == ("completed", None, 1.0), row
    assert result.calls >= 2, row
    rows = read_trajectories(result.trajectories).to_pylist()
    assert rows and all(r["reward"] == result.reward and r["weight"] == 1.0 for r in rows), row
    assert json.loads(rows[0]["metadata"])["task"]["tampered"] == result.tampered, row
