"""Sandbox start time per runtime on this machine: the wall time of one exec of `true` (through the in-sandbox
forwarder, with the per-sandbox cgroup made and removed), median of N, and its ratio to the same command run
on the host in the same run (the forwarder's python start included there too).

    .venv/bin/python bench/sandbox.py [--runs 10]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from polar.limits import mechanism  # noqa: E402
from polar.runtime import REGISTRY, Mounts, bridged, get_runtime, run_group  # noqa: E402


def median_exec(runtime: str | None, mounts: Mounts, runs: int) -> float:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(mounts.home)}
    out, err = mounts.shared / "out", mounts.shared / "err"
    times = []
    for _ in range(runs):
        start = time.monotonic()
        if runtime is None:
            result = run_group(bridged(["true"], []), env, mounts.workspace, 60, out, err, limits=None)
        else:
            result = get_runtime(runtime).prepare(mounts).exec(["true"], env, mounts.workspace, 60, out, err)
        times.append(time.monotonic() - start)
        if result.exit_code != 0:
            raise SystemExit(f"{runtime}: exit {result.exit_code}: {err.read_text()[-500:]}")
    return statistics.median(times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=10)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        mounts = Mounts(Path(tmp) / "home", Path(tmp) / "workspace", Path(tmp) / "sandbox")
        for d in (mounts.home, mounts.workspace, mounts.shared):
            d.mkdir()
        base = median_exec(None, mounts, args.runs)
        print(f"limits: {mechanism()}")
        print(f"{'host (no sandbox)':20} {base * 1000:7.1f} ms")
        for name in REGISTRY:
            if name == "apptainer":
                continue  # needs an image: its start time is measured by the apptainer runtime's own bench
            t = median_exec(name, mounts, args.runs)
            print(f"{name:20} {t * 1000:7.1f} ms  {t / base:5.2f}x host")
    return 0


if __name__ == "__main__":
    sys.exit(main())
