"""Benchmark polar_traj: calls/s to build and write Parquet, peak memory, and trainer tokens
per_request ÷ prefix_merge on synthetic agent sessions of 5, 20 and 100 turns.

Each session: a title side call, then an append-only agent loop (system+tools 1500 tokens, task 200,
each turn samples 150 tokens and gets a 400-token tool result back); each record carries a
chat request whose text grows with the conversation, as real captures do. Every measurement runs in
a fresh process (peak RSS is per process). Bounded: well under a minute on 2 cores.

    .venv/bin/python bench/traj.py [--json]
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import resource
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


def measure(capture: str, strategy: str, out: str, queue: mp.Queue) -> None:
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


def run_case(turns: int, sessions: int, workdir: Path) -> dict:
    rng = np.random.default_rng(turns * 1000 + sessions)
    capture = workdir / f"capture-{turns}x{sessions}"
    calls = sum(write_session(capture, f"task{s % 4}", f"s{s}", turns, rng) for s in range(sessions))
    row: dict = {"turns": turns, "sessions": sessions, "calls": calls,
                 "capture_mb": sum(p.stat().st_size for p in capture.rglob("*.jsonl")) / 2**20}
    ctx = mp.get_context("spawn")
    for strategy in ("per_request", "prefix_merge"):
        queue = ctx.Queue()
        proc = ctx.Process(target=measure, args=(str(capture), strategy, str(workdir / f"{strategy}.parquet"), queue))
        proc.start()
        got = queue.get(timeout=120)
        proc.join()
        row[strategy] = got
    pr, pm = row["per_request"]["stats"], row["prefix_merge"]["stats"]
    row["token_ratio"] = pr["trajectory_tokens"] / pm["trajectory_tokens"]
    row["sample_ratio"] = pr["trajectories"] / pm["trajectories"]
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="polar-traj-bench-") as tmp:
        rows = [run_case(turns, sessions, Path(tmp)) for turns, sessions in CASES]
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    print(f"{'turns':>5} {'sess':>5} {'calls':>6} {'capMB':>6} | {'strategy':<12} {'calls/s':>8} {'/cpu-s':>7}"
          f" {'peakMB':>7}"
          f" {'rows':>5} {'tokens':>10} | {'tok ratio':>9} {'samples':>8}")
    for r in rows:
        for strategy in ("per_request", "prefix_merge"):
            m = r[strategy]
            ratio = f"{r['token_ratio']:9.2f} {r['sample_ratio']:8.2f}" if strategy == "prefix_merge" else ""
            print(f"{r['turns']:>5} {r['sessions']:>5} {r['calls']:>6} {r['capture_mb']:>6.1f} | {strategy:<12}"
                  f" {r['calls'] / m['seconds']:>8.0f} {r['calls'] / m['cpu_seconds']:>7.0f}"
                  f" {m['rss_peak_mb']:>7.0f} {m['rows']:>5}"
                  f" {m['stats']['trajectory_tokens']:>10} | {ratio}")
    print(f"total {time.perf_counter() - started:.1f}s (calls/s: wall clock; /cpu-s: per CPU second of the build"
          f" process; tok ratio = trainer tokens per_request / prefix_merge; samples = trajectories per_request"
          f" / prefix_merge)")


if __name__ == "__main__":
    main()
