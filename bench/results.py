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
import proxy_perf  # noqa: E402
import sessions  # noqa: E402
import traj  # noqa: E402

NOTES = {
    "peers": "Proxy CPU per call (its processes, from /proc), calls/s and latency of non-streamed chat calls, "
             "and streaming time to first token, all against a zero-compute stub engine (bench/peers.py).",
    "captures": "Bytes per session, format 1 vs the linear form, against the floor of every distinct thing "
                "once (bench/captures.py, docs/captures.md).",
    "proxy_perf": "The proxy-performance table of issue 30: Polar beside bare mitmdump and LiteLLM in one run "
                  "(tiny and realistic 75 KB bodies, a 100-turn session, streaming, 1/2/4 proxy processes, a real "
                  "pi session's capture), zero-compute stub engine (bench/proxy_perf.py); the last row is "
                  "bench/traj.py's, from the same run.",
    "rollout": "Rollout service throughput (real `celery -A workers worker` nodes, Redis, the reference server, Pi "
               "in bubblewrap) and the service's own cost per sample: a zero-work batch (one curl call per sample, "
               "evaluator `true`, bubblewrap, 2 nodes x 2 run slots, a zero-compute stub engine), host CPU-s per "
               "sample machine-wide (/proc/stat), per stage and per process kind (bench/rollout.py). Before issue "
               "47's item 0 (commit 0ef23a3, 2026-12-04, 1,000 samples): 205 s, 293 samples/min, 0.391 CPU-s per "
               "sample, stages prepare 0.023 / run 0.013 / evaluate 0.054 / postrun 0.005 CPU-s (0.064 / 0.310 / "
               "0.332 / 0.010 s wall), worker node processes 0.147, proxies 0.017, Redis 0.005. Before the changes "
               "that met it (commit ee987ac, 2026-12-05, 1,000 samples; those changes measured 0.115-0.130 after, on "
               "the same machine): 137 s, 437 samples/min, 0.250 CPU-s per sample, stages prepare 0.024 / run 0.012 "
               "/ evaluate 0.054 / postrun 0.005 CPU-s, worker node processes 0.126, proxies 0.016, Redis 0.004, "
               "other (the sandboxes' processes, which init reaps, and the kernel) 0.104.",
    "sessions": "1,024 concurrent long sessions through one proxy (issue 47): each a ~75 KB first call, then "
                "6,000-token turns up to 101k tokens (13 rounds; the issue's 1,500-token shape, and the "
                "before/after of the change that met the RSS goal, are in bench/sessions.md), the zero-compute "
                "stub engine; bare mitmdump's RSS after the same first round is the baseline (bench/sessions.py).",
    "traj": "Trajectory build from captures: `before` is polar_traj as of the baseline commit, `f1` this "
            "checkout on the same format-1 files, `linear` this checkout on the same sessions in the linear "
            "form (bench/traj.py).",
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


def bench_peers(tmp: Path) -> object:
    raw = tmp / "peers.json"
    run_text([str(BENCH / "peers.py"), "--json", str(raw)], 900)
    return json.loads(raw.read_text())


def bench_proxy_perf(tmp: Path) -> object:
    raw = tmp / "proxy_perf.json"
    run_text([str(BENCH / "proxy_perf.py"), "--json", str(raw)], 900)
    return json.loads(raw.read_text())


def bench_sessions(tmp: Path) -> object:
    raw = tmp / "sessions.json"
    run_text([str(BENCH / "sessions.py"), "--turn-tokens", "6000", "--json", str(raw)], 1800)
    return json.loads(raw.read_text())


def sessions_table(res: dict) -> list[str]:
    head, *rest = sessions.table(res)
    return [head.removeprefix("# ") + ".", *rest]  # its own title, as a line of this section


def bench_text(name: str):
    def run(_: Path) -> object:
        return {"stdout": run_text([str(BENCH / f"{name}.py")], 900)}
    return run


def text_table(data: dict) -> list[str]:
    return ["```", data["stdout"].rstrip(), "```"]


# name -> (run it: raw results, render the raw results as markdown lines); any other bench/*.py runs as text
BENCHES = {
    "peers": (bench_peers, peers.table),
    "proxy_perf": (bench_proxy_perf, proxy_perf.table),
    "captures": (lambda _: run_json([str(BENCH / "captures.py"), "--json"], 900), captures.table),
    "traj": (lambda _: run_json([str(BENCH / "traj.py"), "--json"], 1800), traj.table),
    "sessions": (bench_sessions, sessions_table),
}
NOT_BENCHES = {"results", "stub_engine"}
for _path in sorted(BENCH.glob("*.py")):
    if _path.stem not in BENCHES and _path.stem not in NOT_BENCHES:
        BENCHES[_path.stem] = (bench_text(_path.stem), text_table)


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", choices=sorted(BENCHES),
                    help="run only these benches; the others keep their last results from bench/results.json")
    args = ap.parse_args()
    peers.in_namespace()
    old = json.loads((BENCH / "results.json").read_text()) if args.only and (BENCH / "results.json").exists() else {}
    report: dict = {"benches": old.get("benches", {})}
    failed = False
    for name in args.only or list(BENCHES):
        print(f"== {name}", flush=True)
        entry = {"machine": peers.machine(), "date": _now(), "commit": _commit()}
        start = time.perf_counter()
        try:
            with tempfile.TemporaryDirectory(prefix=f"polar-bench-{name}-") as tmp:
                entry["results"] = BENCHES[name][0](Path(tmp))
        except Exception as e:  # one failed bench must not hide the others' results
            failed, entry["error"] = True, str(e)
        entry["seconds"] = time.perf_counter() - start
        report["benches"][name] = entry
        write_atomic(BENCH / "results.json", json.dumps(report, indent=2) + "\n")  # nothing lost to a later failure
        print("\n".join(section(name, entry)), flush=True)
    md = ["# Bench results", "",
          "Written by `make bench` (bench/results.py). Every bench runs inside a loopback-only network namespace; "
          "compare ratios within one run, not absolute numbers across machines or runs. Raw numbers: "
          "bench/results.json. Before/after tables of single changes: bench/sessions.md (long sessions in one "
          "proxy), bench/train_loop.md (the training loop).", ""]
    for name in BENCHES:
        if {"machine", "seconds"} <= report["benches"].get(name, {}).keys():  # entries of an older layout are left out
            md += section(name, report["benches"][name], report)
    write_atomic(BENCH / "results.md", "\n".join(md))
    write_atomic(BENCH / "results.json", json.dumps(report, indent=2) + "\n")
    print(f"wrote {BENCH / 'results.md'} and {BENCH / 'results.json'}")
    return 1 if failed else 0


def section(name: str, entry: dict, report: dict | None = None) -> list[str]:
    m = entry["machine"]
    where = (f"Run {entry['date']} at commit {entry['commit']} in {entry['seconds']:.0f} s on {m['cpu']}, "
             f"{m['cores']} cores, Python {m['python']}, Linux {m['kernel']}, load average {m['load_1min']:.1f} "
             f"at the start.")
    if "error" in entry:
        body = [f"**failed**: {entry['error']}"]
    elif name == "proxy_perf":  # its table ends with the trajectory-build row, from the traj bench of this run
        body = proxy_perf.table(entry["results"], _same_run_traj(entry, report or {}))
    else:
        body = BENCHES[name][1](entry["results"])
    note = NOTES.get(name) or _docstring(BENCH / f"{name}.py")
    return [f"## {name}", "", note, "", where, "", *body, ""]


def _same_run_traj(entry: dict, report: dict) -> list[dict] | None:
    traj = report.get("benches", {}).get("traj", {})
    if "results" in traj and traj.get("commit") == entry.get("commit") and traj["date"][:10] == entry["date"][:10]:
        return traj["results"]
    return None


def _docstring(path: Path) -> str:
    """The first paragraph of a bench's docstring."""
    try:
        text = path.read_text()
        doc = text.split('"""')[1] if text.lstrip().startswith('"""') else ""
    except (OSError, IndexError):
        return ""
    return " ".join(doc.strip().split("\n\n")[0].split())


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _commit() -> str:
    try:
        return subprocess.run(["git", "-C", str(BENCH.parent), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "?"


if __name__ == "__main__":
    sys.exit(main())
