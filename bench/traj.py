"""Benchmark polar_traj: calls/s to build and write Parquet, peak memory, and trainer tokens
per_request ÷ prefix_merge on synthetic agent sessions of 5, 20 and 100 turns.

Each case is built three ways in the same run: `before` = polar_traj as of BASELINE (git archive of that
commit, stdlib json reader) on format-1 captures; `f1` = this checkout on the same files; `linear` = this
checkout on the same sessions written in the linear form (docs/captures.md). MB/cpu-s counts the
format-1 file size, so the three rows read the same amount of capture.

Each session: a title side call, then an append-only agent loop (system+tools 1500 tokens, task 200,
each turn samples 150 tokens and gets a 400-token tool result back); each record carries a
chat request whose text grows with the conversation, as real captures do. Every measurement runs in
a fresh process (peak RSS is per process). Bounded: well under a minute on 2 cores.

The table ends with the figures of issue 30's row (prefix_merge MB/cpu-s and per_request ×before at
100 turns); `issue_figures(rows)` gives them from the --json rows.

    .venv/bin/python bench/traj.py [--json] [--baseline REV | --no-baseline]
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import numpy as np  # noqa: E402

SYSTEM, TASK, OUTPUT, TOOL, EOT = 1500, 200, 150, 400, 2
# (turns per session, sessions): the two 5-turn rows show memory staying flat as files multiply
CASES = [(5, 40), (5, 400), (20, 20), (100, 3)]
BASELINE = "7f3cbd3"  # the last commit before the orjson reader and the linear capture form


def write_session(capture: Path, task: str, session: str, turns: int, rng: np.random.Generator) -> int:
    """One capture file, written in one go (the proxy appends and fsyncs per call; not what is measured)."""
    lines, clock = [], 0.0

    def record(call_id: str, prompt: list[int], output: list[int], text: int) -> None:
        nonlocal clock
        clock += 1.0
        lines.append(json.dumps({
            "call_id": call_id, "task_id": task, "session_id": session, "api": "openai_chat", "model": "m",
            "stream": True, "started_at": clock, "ended_at": clock + 0.5, "latency_ms": 500.0, "policy_version": 1,
            "prompt_ids": prompt, "output_ids": output, "output_logprobs": [-0.5] * len(output),
            "finish_reason": "stop", "prefix_source": "substituted", "parent_call_id": None,
            "request": {"model": "m", "stream": True, "messages": [{"role": "user", "content": "x" * text}]},
            "response": {"choices": [{"message": {"role": "assistant", "content": "y" * 4 * len(output)}}]},
            "error": None, "flags": [],
        }))

    def tokens(n: int) -> list[int]:
        return rng.integers(3, 32000, n).tolist()

    record("title", tokens(60), tokens(10) + [EOT], 240)
    prompt = tokens(SYSTEM) + tokens(TASK)
    for n in range(turns):
        output = tokens(OUTPUT - 1) + [EOT]
        record(f"c{n}", prompt, output, 4 * len(prompt))
        prompt = prompt + output + tokens(TOOL)
    path = capture / task / f"{session}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return turns + 1


def measure(capture: str, strategy: str, out: str, queue: mp.Queue, src: str | None = None) -> None:
    if src:
        sys.path.insert(0, src)  # before polar_traj is first imported in this fresh process
    from polar_traj.build import BuildConfig
    from polar_traj.pipeline import Selection, build_parquet

    warm = Path(out).with_name("warm")  # first-use costs (imports, pyarrow kernels) are not measured
    write_session(warm / "capture", "t", "s", 2, np.random.default_rng(0))
    build_parquet(Selection(warm / "capture"), warm / "out.parquet", BuildConfig(strategy=strategy))
    usage = resource.getrusage(resource.RUSAGE_SELF)
    before, cpu = usage.ru_maxrss, usage.ru_utime + usage.ru_stime
    start = time.perf_counter()
    result = build_parquet(Selection(capture), out, BuildConfig(strategy=strategy))
    elapsed = time.perf_counter() - start
    usage = resource.getrusage(resource.RUSAGE_SELF)
    peak, cpu = usage.ru_maxrss, usage.ru_utime + usage.ru_stime - cpu
    queue.put({"seconds": elapsed, "cpu_seconds": cpu, "rows": result.rows, "stats": result.stats.to_dict(),
               "rss_before_mb": before / 1024, "rss_peak_mb": peak / 1024,
               "file_mb": Path(out).stat().st_size / 2**20})


def to_linear(capture: Path, out: Path) -> None:
    from polar_traj.captures import CaptureWriter
    from polar_traj.capture_reader import read_capture

    writer = CaptureWriter(out, fsync=False)
    for path in sorted(capture.rglob("*.jsonl")):
        for record in read_capture(path):
            writer.write(record)


def baseline_src(rev: str, workdir: Path) -> str | None:
    """polar_traj as of `rev`, unpacked under workdir; None (with a line saying why) when git cannot."""
    dest = workdir / f"baseline-{rev}"
    dest.mkdir()
    try:
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "polar_traj"], capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)
    except (OSError, subprocess.CalledProcessError) as e:
        print(f"traj bench: no baseline {rev} ({e}); before rows skipped", file=sys.stderr)
        return None
    return str(dest)


def build_once(capture: Path, strategy: str, workdir: Path, src: str | None) -> dict:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=measure, args=(str(capture), strategy, str(workdir / f"{strategy}.parquet"), queue, src))
    proc.start()
    got = queue.get(timeout=300)
    proc.join()
    return got


def run_case(turns: int, sessions: int, workdir: Path, src: str | None) -> dict:
    rng = np.random.default_rng(turns * 1000 + sessions)
    capture = workdir / f"capture-{turns}x{sessions}"
    calls = sum(write_session(capture, f"task{s % 4}", f"s{s}", turns, rng) for s in range(sessions))
    linear = workdir / f"linear-{turns}x{sessions}"
    to_linear(capture, linear)
    row: dict = {"turns": turns, "sessions": sessions, "calls": calls,
                 "capture_mb": sum(p.stat().st_size for p in capture.rglob("*.jsonl")) / 2**20,
                 "linear_mb": sum(p.stat().st_size for p in linear.rglob("*.jsonl")) / 2**20}
    variants = [("before", capture, src)] if src and turns >= 20 else []
    variants += [("f1", capture, None), ("linear", linear, None)]
    for name, files, code in variants:
        for strategy in ("per_request", "prefix_merge"):
            row[f"{name}/{strategy}"] = build_once(files, strategy, workdir, code)
    pr, pm = row["f1/per_request"]["stats"], row["f1/prefix_merge"]["stats"]
    row["token_ratio"] = pr["trajectory_tokens"] / pm["trajectory_tokens"]
    row["sample_ratio"] = pr["trajectories"] / pm["trajectories"]
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--baseline", default=BASELINE, help="git revision measured as `before`")
    parser.add_argument("--no-baseline", action="store_true")
    args = parser.parse_args()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="polar-traj-bench-") as tmp:
        src = None if args.no_baseline else baseline_src(args.baseline, Path(tmp))
        rows = [run_case(turns, sessions, Path(tmp), src) for turns, sessions in CASES]
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    print("\n".join(table(rows)))
    print(f"total {time.perf_counter() - started:.1f}s (calls/s: wall clock; /cpu-s and MB/cpu-s: per CPU second of "
          f"the build process, MB of format-1 capture; ×before: calls/cpu-s over `before` ({args.baseline}); "
          f"tok ratio = trainer tokens per_request / prefix_merge; samples = trajectories per_request / prefix_merge)")


def issue_figures(rows: list[dict], turns: int = 100) -> dict:
    """The figures of issue 30's trajectory-build row, from the `turns`-turn case: prefix_merge MB of
    format-1 capture per CPU second (f1 and linear), per_request calls/cpu-s over `before` (None without
    a baseline)."""
    r = next(r for r in rows if r["turns"] == turns)
    before = r.get("before/per_request")
    return {
        "turns": turns,
        "prefix_merge_mb_per_cpu_s": {name: r["capture_mb"] / r[f"{name}/prefix_merge"]["cpu_seconds"]
                                      for name in ("f1", "linear")},
        "per_request_x_before": {name: before["cpu_seconds"] / r[f"{name}/per_request"]["cpu_seconds"]
                                 if before else None for name in ("f1", "linear")},
    }


def figures_line(rows: list[dict]) -> str:
    f = issue_figures(rows)
    mb, gain = f["prefix_merge_mb_per_cpu_s"], f["per_request_x_before"]
    gains = " / ".join("–" if gain[n] is None else f"{gain[n]:.1f}" for n in ("f1", "linear"))
    return (f"Issue 30 row (trajectory build, {f['turns']} turns, f1 / linear): prefix_merge "
            f"{mb['f1']:.0f} / {mb['linear']:.0f} MB/cpu-s (target ≥ 300); per_request ×before {gains} "
            f"(target ≥ 5).")


def table(rows: list[dict]) -> list[str]:
    out = ["| turns | sess | calls | f1 MB | linear MB | reader | strategy | calls/s | calls/cpu-s | ×before | "
           "MB/cpu-s | peak MB | tok ratio | samples |", "|" + "---|" * 14]
    for r in rows:
        for strategy in ("per_request", "prefix_merge"):
            before = r.get(f"before/{strategy}")
            for name in ("before", "f1", "linear"):
                m = r.get(f"{name}/{strategy}")
                if m is None:
                    continue
                per_cpu = r["calls"] / m["cpu_seconds"]
                gain = f"{per_cpu / (r['calls'] / before['cpu_seconds']):.1f}" if before else "–"
                ratio = (f"{r['token_ratio']:.2f} | {r['sample_ratio']:.2f}"
                         if strategy == "prefix_merge" and name == "f1" else " | ")
                out.append(f"| {r['turns']} | {r['sessions']} | {r['calls']} | {r['capture_mb']:.1f} | "
                           f"{r['linear_mb']:.1f} | {name} | {strategy} | {r['calls'] / m['seconds']:.0f} | "
                           f"{per_cpu:.0f} | {gain} | {r['capture_mb'] / m['cpu_seconds']:.0f} | "
                           f"{m['rss_peak_mb']:.0f} | {ratio} |")
    if any(r["turns"] == 100 for r in rows):
        out += ["", figures_line(rows)]
    return out


if __name__ == "__main__":
    main()
