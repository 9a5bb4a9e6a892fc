"""Many engines: one proxy in front of two reference-server replicas, one slowed by a scripted delay per token.
Throughput of least-loaded session placement against round-robin, and the prefix-cache benefit of keeping a
session on one replica: prompt tokens the engines had to read fresh per call (their GET /metrics), against the
same calls with each one sent to another replica than its session's previous call (which a balancer that
ignores sessions does to about half of the calls with two replicas).

    .venv/bin/python bench/engines.py [--sessions 32] [--turns 8] [--concurrency 8] [--slow-ms 20]
"""
from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

from polar_mitm.launch import start_proxy, stop  # noqa: E402
from polar_serve.launch import reference_server  # noqa: E402
from polar_traj.capture_reader import read_capture  # noqa: E402

MODEL = ROOT / "fixtures" / "tiny-qwen2"
POLICY = ROOT / "fixtures" / "policies" / "plain-answer.yaml"  # a short reply: the prompt is what grows
WORDS = "the quick brown fox reads a long tool output and writes a short patch to the repository".split()


def metrics(url: str) -> dict[str, int]:
    text = httpx.get(url + "/metrics", timeout=30).text
    return {k: int(v) for k, v in (line.split() for line in text.splitlines() if line and line[0] != "#")}


def fresh_tokens(urls: list[str], before: dict[str, dict[str, int]]) -> tuple[int, int, int]:
    """(requests, prompt tokens, prompt tokens from the cache) across the replicas since `before`."""
    totals = [0, 0, 0]
    for url in urls:
        now = metrics(url)
        for i, name in enumerate(("requests", "prompt_tokens", "cached_tokens")):
            key = f"polar_serve_{name}_total"
            totals[i] += now[key] - before[url][key]
    return totals[0], totals[1], totals[2]


def flush(urls: list[str]) -> dict[str, dict[str, int]]:
    for url in urls:
        httpx.post(url + "/flush_cache", timeout=30)
    return {url: metrics(url) for url in urls}


SYSTEM = "You are a coding agent. " + " ".join(WORDS[i % len(WORDS)] for i in range(400))  # shared by every session


def user_turn(name: str, k: int) -> str:
    """A tool output's worth of text: the part of the prompt that is new at each call."""
    return f"{name} turn {k}: " + " ".join(WORDS[(i * 7 + k) % len(WORDS)] for i in range(100))


async def run_sessions(base: str, n: int, turns: int, concurrency: int) -> float:
    gate = asyncio.Semaphore(concurrency)

    async def session(i: int) -> None:
        name = f"bench-{i}"
        messages: list[dict] = [{"role": "system", "content": SYSTEM}]
        async with gate:
            for k in range(turns):
                messages.append({"role": "user", "content": user_turn(name, k)})
                r = await client.post(base + "/v1/chat/completions", headers={"authorization": f"Bearer {name}"},
                                      json={"model": "tiny", "messages": messages, "max_tokens": 64})
                r.raise_for_status()
                messages.append({"role": "assistant", "content": r.json()["choices"][0]["message"]["content"]})

    async with httpx.AsyncClient(timeout=300) as client:
        t0 = time.perf_counter()
        await asyncio.gather(*(session(i) for i in range(n)))
        return time.perf_counter() - t0


def live(workdir: Path, urls: list[str], placement: str, args: argparse.Namespace) -> dict:
    before = flush(urls)
    proc, proxy = start_proxy(workdir, ",".join(urls), MODEL, "--set", f"polar_engine_placement={placement}")
    try:
        wall = asyncio.run(run_sessions(proxy.base_url, args.sessions, args.turns, args.concurrency))
    finally:
        stop(proc)
    records = [r for path in sorted(proxy.capture_dir.rglob("*.jsonl")) for r in read_capture(path)]
    sessions = {url: len({r.session_id for r in records if r.engine == url}) for url in urls}
    requests, prompt, cached = fresh_tokens(urls, before)
    return {"placement": placement, "wall_s": wall, "calls": len(records), "calls_per_s": len(records) / wall,
            "sessions": sessions, "prompt_per_call": prompt / requests, "fresh_per_call": (prompt - cached) / requests,
            "records": records}


def replay(urls: list[str], records: list, route: str) -> dict:
    """The recorded calls again, in their order, straight to the engines: `affine` to the replica that served
    them, `alternate` each call of a session to the replica after its previous call's (what a balancer that
    ignores sessions does to (n-1)/n of the calls)."""
    before = flush(urls)
    ordered = sorted(records, key=lambda r: r.started_at)
    turn: dict[str, int] = {}
    for r in ordered:
        k = turn[r.session_id] = turn.get(r.session_id, -1) + 1
        url = r.engine if route == "affine" else urls[(urls.index(r.engine) + k) % len(urls)]
        body = {"input_ids": list(r.prompt_ids), "sampling_params": {"max_new_tokens": max(1, len(r.output_ids))}}
        httpx.post(url + "/generate", json=body, timeout=300).raise_for_status()
    requests, prompt, cached = fresh_tokens(urls, before)
    return {"route": route, "calls": requests, "fresh_per_call": (prompt - cached) / requests}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sessions", type=int, default=32)
    ap.add_argument("--turns", type=int, default=8)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--slow-ms", type=float, default=20.0, help="per-token delay of the slow replica")
    args = ap.parse_args()
    with ExitStack() as stack, tempfile.TemporaryDirectory(prefix="polar-bench-engines-") as tmp:
        fast = stack.enter_context(reference_server(MODEL, POLICY))
        slow = stack.enter_context(reference_server(MODEL, POLICY, ("--step-delay-ms", str(args.slow_ms))))
        urls = [fast, slow]
        runs = [live(Path(tmp) / p, urls, p, args) for p in ("round_robin", "least_loaded")]
        replays = [replay(urls, runs[1]["records"], route) for route in ("affine", "alternate")]
    base = runs[0]
    print(f"{args.sessions} sessions x {args.turns} calls, concurrency {args.concurrency}; replica 1 at full speed, "
          f"replica 2 slowed by {args.slow_ms:g} ms a token (polar serve --step-delay-ms)")
    print()
    print(f"{'placement':<14}{'wall s':>8}{'calls/s':>9}{'vs rr':>7}{'sessions fast/slow':>20}"
          f"{'prompt tok/call':>17}{'fresh tok/call':>16}")
    for run in runs:
        split = "/".join(str(run["sessions"][u]) for u in urls)
        print(f"{run['placement']:<14}{run['wall_s']:>8.1f}{run['calls_per_s']:>9.1f}"
              f"{run['calls_per_s'] / base['calls_per_s']:>6.2f}x{split:>20}{run['prompt_per_call']:>17.0f}"
              f"{run['fresh_per_call']:>16.0f}")
    print()
    print("least_loaded's calls replayed straight to the engines, caches flushed first:")
    for rep in replays:
        print(f"  {rep['route']:<9} {rep['calls']} calls, {rep['fresh_per_call']:.0f} prompt tokens read fresh per call")
    ratio = replays[1]["fresh_per_call"] / max(replays[0]["fresh_per_call"], 1e-9)
    print(f"  session affinity: {ratio:.2f}x fewer fresh prompt tokens than moving every call to the next replica")
    return 0


if __name__ == "__main__":
    sys.exit(main())
