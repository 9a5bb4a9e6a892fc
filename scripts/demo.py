"""`make demo`: Polar's main job on embedded defaults. A real, unchanged harness (Codex CLI) runs in a
loopback-only sandbox against the proxy and the reference server (tiny model, scripted `shell-once`
policy: call the shell tool to write a file, then answer "Done."). Every call is recorded token-exact
and merged into one trajectory, written as Parquet; this prints the run summary and the trajectory.

    .venv/bin/python scripts/demo.py [--adapter NAME] [--via https_proxy|base_url] [--out DIR]
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
MODEL = ROOT / "fixtures" / "tiny-qwen2"
POLICY = ROOT / "fixtures" / "policies" / "shell-once.yaml"
INSTRUCTION = "Create the file polar.txt containing the word polar, using the shell."


def show_trajectory(parquet: Path, shown: int) -> None:
    import pyarrow.parquet as pq

    from polar.report_tokens import load_decode, terminal_lines

    decode = load_decode(MODEL)
    rows = pq.read_table(parquet).to_pylist()
    print(f"\n== {parquet} ({len(rows)} trajectories; pandas.read_parquet reads it as is)")
    for row in rows:
        print("\n".join(terminal_lines(row, decode, shown)))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--adapter", default="codex")
    ap.add_argument("--via", default="https_proxy", choices=["https_proxy", "base_url"])
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / f"demo-{time.strftime('%Y%m%d-%H%M%S')}")
    ap.add_argument("--show", type=int, default=400, help="trajectory tokens to print")
    args = ap.parse_args()
    print(f"== polar run --adapter {args.adapter} --via {args.via} --policy {POLICY.relative_to(ROOT)}")
    cmd = [sys.executable, "-m", "polar.cli", "run", "--adapter", args.adapter, "--via", args.via,
           "--instruction", INSTRUCTION, "--policy", str(POLICY), "--model", str(MODEL), "--out", str(args.out)]
    code = subprocess.call(cmd, cwd=ROOT)
    if code != 0:
        print(f"demo: polar run failed with exit {code}; its logs are in {args.out}", file=sys.stderr)
        return code
    made = args.out / "workspace" / "polar.txt"
    print(f"\n== the harness's shell wrote {made}: {made.read_text()!r}" if made.exists()
          else f"\n== {made} was not written")
    show_trajectory(args.out / "trajectories.parquet", args.show)
    return 0


if __name__ == "__main__":
    sys.exit(main())
