"""`make bench`: run every bench once, inside one loopback-only network namespace, and write
bench/results.md (each bench's table, the machine noted) and bench/results.json (the raw numbers).
A bench that fails is reported as failed in both files; the exit status is then 1.

    .venv/bin/python bench/results.py [--only NAME ...]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

import captures  # noqa: E402
import peers  # noqa: E402
import traj  # noqa: E402

NOTES = {
    "peers": "Proxy CPU per call (its processes, from /proc), calls/s and latency of non-streamed chat calls, "
             "and streaming time to first token, all against a zero-compute stub engine (bench/peers.py).",
    "captures": "Bytes per session, format 1 vs the linear form, against the floor of every distinct thing "
                "once (bench/captures.py, docs/captures.md).",
    "traj": "Trajectory build from captures: `before` is polar_traj as of the baseline commit, `f1` this "
            "checkout on the same format-1 files, `linear` this checkout on the same sessions in the linear "
            "form (bench/traj.py).",
    "proxy": "Proxy overhead against the CPU reference engine (bench/proxy.py).",
    "serve": "The CPU reference engine (bench/serve.py).",
}


def run_json(args: list[str], timeout: float) -> object:
    out = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=timeout)
    if out.returncode:
        raise RuntimeError(f"exit {out.returncode}: {out.stderr[-2000:]}")
    return json.loads(out.stdout)


def run_text(args: list[str], timeout: float) -> str:
    out = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=timeout)
    if out.returncode:
        raise RuntimeError(f"exit {out.returncode}: {out.stderr[-2000:]}")
    return out.stdout


def bench_peers(tmp: Path) -> tuple[object, list[str]]:
    raw = tmp / "peers.json"
    run_text([str(BENCH / "peers.py"), "--json", str(raw)], 900)
    data = json.loads(raw.read_text())
    return data, peers.table(data)


def bench_captures(_: Path) -> tuple[object, list[str]]:
    data = run_json([str(BENCH / "captures.py"), "--json"], 900)
    return data, captures.table(data)


def bench_traj(_: Path) -> tuple[object, list[str]]:
    data = run_json([str(BENCH / "traj.py"), "--json"], 1800)
    return data, traj.table(data)


def bench_text(name: str):
    def run(_: Path) -> tuple[object, list[str]]:
        text = run_text([str(BENCH / f"{name}.py")], 900)
        return {"stdout": text}, ["```", text.rstrip(), "```"]
    return run


BENCHES = {"peers": bench_peers, "captures": bench_captures, "traj": bench_traj,
           "proxy": bench_text("proxy"), "serve": bench_text("serve")}


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", choices=sorted(BENCHES), help="run only these benches")
    args = ap.parse_args()
    peers.in_namespace()
    machine = peers.machine()
    report: dict = {"machine": machine, "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                    "commit": _commit(), "benches": {}}
    md = ["# Bench results", "",
          f"Written by `make bench` on {report['date']} at commit {report['commit']}. Machine: {machine['cpu']}, "
          f"{machine['cores']} cores, Python {machine['python']}, Linux {machine['kernel']}, "
          f"load average {machine['load_1min']:.1f} when it started. Every bench runs inside a loopback-only "
          f"network namespace; compare ratios within one run, not absolute numbers across machines.", ""]
    failed = False
    for name in args.only or list(BENCHES):
        print(f"== {name}", flush=True)
        start = time.perf_counter()
        try:
            with tempfile.TemporaryDirectory(prefix=f"polar-bench-{name}-") as tmp:
                data, lines = BENCHES[name](Path(tmp))
            report["benches"][name] = {"seconds": time.perf_counter() - start, "results": data}
        except Exception as e:  # one failed bench must not hide the others' results
            failed = True
            lines = [f"**failed**: {e}"]
            report["benches"][name] = {"seconds": time.perf_counter() - start, "error": str(e)}
        print("\n".join(lines), flush=True)
        md += [f"## {name}", "", NOTES[name], "", *lines, ""]
    write_atomic(BENCH / "results.md", "\n".join(md))
    write_atomic(BENCH / "results.json", json.dumps(report, indent=2) + "\n")
    print(f"wrote {BENCH / 'results.md'} and {BENCH / 'results.json'}")
    return 1 if failed else 0


def _commit() -> str:
    try:
        return subprocess.run(["git", "-C", str(BENCH.parent), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "?"


if __name__ == "__main__":
    sys.exit(main())
