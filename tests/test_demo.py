"""`make demo`'s code path (scripts/demo.py) with a smaller batch: one task, a group of 2, one harness (Pi), in the
default runtime (Apptainer for the task's image), through a real worker node, Redis and the reference server."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow


def processes_naming(text: str) -> list[str]:
    """Command lines of live processes that mention `text` (the demo's folder)."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in args and "pytest" not in args:
            found.append(args)
    return found


def test_demo_batch_end_to_end(tmp_path):
    out = tmp_path / "demo-small"
    done = subprocess.run([sys.executable, "scripts/demo.py", "--harness", "pi", "--task", "fix-calc",
                           "--group-size", "2", "--out", str(out)], cwd=ROOT, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    text = done.stdout
    assert "== batch summary" in text and "samples: 2 (completed 2)" in text
    assert "reward mean per task: fix-calc-pi" in text and "reward mean per harness: pi" in text
    assert "trainer tokens: per_request" in text and "wall time:" in text
    rows = pq.read_table(out / "trajectories").to_pylist()
    assert {r["session_id"] for r in rows} == {f"{out.name}.fix-calc-pi.0", f"{out.name}.fix-calc-pi.1"}
    assert all(r["reward"] in (0.0, 1.0) and r["status"] == "completed" for r in rows)  # scored by the tests
    # a fixed repo is what earns the reward: the policy's sed line in the call, reward 1.0, and vice versa
    for r in rows:
        fixed = "a + b" in (out / "samples" / r["session_id"] / "attempt-1" / "workspace" / "calc.py").read_text()
        assert (r["reward"] == 1.0) == fixed, r["session_id"]
    page = (out / "report.html").read_text()
    assert 'data-plot="stages"' in page and 'data-plot="latency"' in page and "fix-calc-pi" in page
    assert processes_naming(str(out)) == []  # Redis, the reference server and the worker node are gone
