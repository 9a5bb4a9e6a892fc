"""Many long sessions in one proxy (issue 47 item 3): N concurrent sessions of a realistic shape through one Polar
proxy in front of the zero-compute stub engine (bench/stub_engine.py): each starts with the ~75 KB qwen-code-like
first call of bench/proxy_perf.py (a long system prompt, 24 tool schemas) with a task of its own, then each turn
adds the reply and a tool result of about TURN tokens, until its prompt passes MAX tokens. Round r sends every live
session's r-th call, CONCURRENCY at a time. Per round: the proxy's RSS, its CPU per call, calls/s, p50/p99 latency;
then capture bytes / floor over a sample of sessions, and bare mitmdump's RSS after the same first round (the same
connections and bodies, forwarded untouched) as the baseline. Prints its table; `--json OUT` writes the raw
results too (bench/results.py runs it so). bench/sessions.md keeps the before/after tables of single changes by hand.

    .venv/bin/python bench/sessions.py [--sessions 1024] [--turn-tokens 1500] [--max-tokens 100000]
                                       [--concurrency 32] [--memory-budget 1.5G] [--json OUT]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import aiohttp  # noqa: E402
import orjson  # noqa: E402

from bench.captures import floor_bytes  # noqa: E402
from bench.peers import MODEL, REPLY, in_namespace, machine, proc_tree_cpu_ms, service, stub_command  # noqa: E402
from bench.proxy import pct  # noqa: E402
from bench.proxy_perf import CHAT, realistic_body  # noqa: E402
from polar_mitm.cli import memory_size  # noqa: E402
from polar_mitm.launch import free_port, proxy_process  # noqa: E402
from polar_mitm.sessions.registry import hashed_id  # noqa: E402
from polar_traj.capture_reader import read_capture  # noqa: E402

LINE = "src/module_{i}.py:{n}: assert value == expected  # ok\n"


def tree_rss_mb(pid: int) -> float:
    """Resident memory of a process and its children (mitmdump is one process; a child, if any, counts)."""
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            total += next(int(line.split()[1]) for line in open(f"/proc/{p}/status") if line.startswith("VmRSS:"))
            todo += [int(c) for c in Path(f"/proc/{p}/task/{p}/children").read_text().split()]
        except (OSError, StopIteration):
            continue
    return total / 1024


def tool_output(turn: int, tokens: int, per_line: int) -> str:
    return "".join(LINE.format(i=turn, n=n) for n in range(max(1, tokens // per_line)))


class Session:
    def __init__(self, n: int, preamble: dict) -> None:
        self.key = f"bench-session-{n:05d}"
        self.body = {**preamble, "messages": [preamble["messages"][0],
                                              {"role": "user", "content": f"Task {n}: fix tests/test_{n}.py"}]}
        self.prompt_tokens = 0

    def grow(self, turn: int, tokens: int, per_line: int) -> None:
        self.body["messages"] = self.body["messages"] + [
            {"role": "assistant", "content": REPLY},
            {"role": "user", "content": f"tool output {turn}:\n" + tool_output(turn, tokens, per_line)}]


async def one_round(url: str, sessions: list[Session], concurrency: int) -> list[float]:
    """Every session's next call, `concurrency` in flight; the latencies (ms). Reads each reply's prompt_tokens."""
    sem, latencies = asyncio.Semaphore(concurrency), []
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=600)) as http:
        async def call(s: Session) -> None:
            async with sem:
                data = orjson.dumps(s.body)
                t0 = time.perf_counter()
                async with http.post(url, data=data, headers={"authorization": f"Bearer {s.key}",
                                                              "content-type": "application/json"}) as r:
                    body = await r.read()
                    if r.status != 200:
                        raise RuntimeError(f"{s.key}: {r.status} {body[:300]!r}")
                latencies.append((time.perf_counter() - t0) * 1000)
                s.prompt_tokens = orjson.loads(body)["usage"]["prompt_tokens"]

        await asyncio.gather(*(call(s) for s in sessions))
    return latencies


def run(args: argparse.Namespace) -> dict:
    from tokenizers import Tokenizer

    per_line = len(Tokenizer.from_file(str(MODEL / "tokenizer.json")).encode(LINE.format(i=7, n=77)).ids)
    preamble = realistic_body("placeholder")
    res: dict = {"machine": machine(), "config": {k: v for k, v in vars(args).items() if k != "json"}, "rounds": []}
    with tempfile.TemporaryDirectory(prefix="polar-sessions-") as tmp_s:
        tmp = Path(tmp_s)
        stub_port = free_port()
        with service(stub_command(stub_port), stub_port, tmp / "stub.log"):
            engine = f"http://127.0.0.1:{stub_port}"
            bare_port = free_port()
            bare_cmd = [str(Path(sys.executable).parent / "mitmdump"), "-q", "--mode",
                        f"reverse:{engine}@127.0.0.1:{bare_port}", "--set", f"confdir={tmp / 'bare-mitm'}"]
            with service(bare_cmd, bare_port, tmp / "bare.log") as pid:
                base = tree_rss_mb(pid)
                asyncio.run(one_round(f"http://127.0.0.1:{bare_port}{CHAT}",
                                      [Session(n, preamble) for n in range(args.sessions)], args.concurrency))
                res["bare"] = {"rss_mb_idle": base, "rss_mb_after_round_1": tree_rss_mb(pid)}
                print(f"bare mitmdump: RSS {base:.0f} MB idle, {res['bare']['rss_mb_after_round_1']:.0f} MB after "
                      f"{args.sessions} first calls", flush=True)
            extra = ["--set", "polar_context_length=262144",
                     "--set", f"polar_max_sessions={max(10000, args.sessions)}"]
            if args.memory_budget:
                extra += ["--set", f"polar_memory_budget={args.memory_budget}"]
            with proxy_process(tmp / "polar", engine, MODEL, *extra) as proxy:
                url, sessions = proxy.base_url + CHAT, [Session(n, preamble) for n in range(args.sessions)]
                res["polar_rss_mb_idle"] = tree_rss_mb(proxy.pid)
                turn = 0
                while sessions and turn < args.max_rounds:
                    cpu0, t0 = proc_tree_cpu_ms(proxy.pid), time.perf_counter()
                    latencies = asyncio.run(one_round(url, sessions, args.concurrency))
                    wall, cpu = time.perf_counter() - t0, proc_tree_cpu_ms(proxy.pid) - cpu0
                    row = {"round": turn + 1, "sessions": len(sessions), "calls_per_s": len(sessions) / wall,
                           "cpu_ms_per_call": cpu / len(sessions), "p50_ms": pct(latencies, 0.5),
                           "p99_ms": pct(latencies, 0.99), "rss_mb": tree_rss_mb(proxy.pid),
                           "prompt_tokens": statistics.median(s.prompt_tokens for s in sessions)}
                    res["rounds"].append(row)
                    print(f"round {row['round']:3d}: {row['sessions']} sessions at {row['prompt_tokens']:.0f} tokens, "
                          f"{row['calls_per_s']:.0f} calls/s, CPU {row['cpu_ms_per_call']:.1f} ms/call, p99 "
                          f"{row['p99_ms']:.0f} ms, RSS {row['rss_mb']:.0f} MB", flush=True)
                    turn += 1
                    sessions = [s for s in sessions if s.prompt_tokens < args.max_tokens]
                    for s in sessions:
                        s.grow(turn, args.turn_tokens, per_line)
                res["captures"] = capture_ratio(proxy.capture_dir / "local", args.sessions)
    return res


def capture_ratio(local: Path, sessions: int, sample: int = 8) -> dict:
    """Capture bytes / the floor (bench/captures.py) over `sample` sessions spread across the run."""
    picked = range(0, sessions, max(1, sessions // sample))
    files = [local / f"{hashed_id(f'bench-session-{n:05d}')}.jsonl" for n in picked]
    got = [(f.stat().st_size, floor_bytes(list(read_capture(f)))["floor"]) for f in files if f.exists()]
    return {"sessions": len(got), "bytes": sum(b for b, _ in got), "floor": sum(f for _, f in got),
            "ratio": sum(b for b, _ in got) / max(1, sum(f for _, f in got))}


def table(res: dict) -> list[str]:
    cfg, rounds = res["config"], res["rounds"]
    first = rounds[0]
    lines = [f"# {cfg['sessions']} sessions in one proxy ({cfg['turn_tokens']} tokens a turn up to "
             f"{cfg['max_tokens']}, {cfg['concurrency']} in flight, memory budget {cfg['memory_budget'] or 'none'}; "
             f"{res['machine']['cores']} cores)", "",
             "| round | sessions | prompt tokens (median) | calls/s | proxy CPU ms/call | x round 1 | p50 ms | "
             "p99 ms | proxy RSS MB |", "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rounds:
        lines.append(f"| {r['round']} | {r['sessions']} | {r['prompt_tokens']:.0f} | {r['calls_per_s']:.0f} | "
                     f"{r['cpu_ms_per_call']:.1f} | {r['cpu_ms_per_call'] / first['cpu_ms_per_call']:.2f} | "
                     f"{r['p50_ms']:.0f} | {r['p99_ms']:.0f} | {r['rss_mb']:.0f} |")
    cap = res["captures"]
    lines += ["", f"Bare mitmdump, same first round: RSS {res['bare']['rss_mb_idle']:.0f} MB idle, "
                  f"{res['bare']['rss_mb_after_round_1']:.0f} MB after it; Polar idle "
                  f"{res['polar_rss_mb_idle']:.0f} MB. "
                  f"Capture bytes / floor over {cap['sessions']} sessions: {cap['ratio']:.2f}."]
    return lines


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sessions", type=int, default=1024)
    p.add_argument("--turn-tokens", type=int, default=1500)
    p.add_argument("--max-tokens", type=int, default=100_000)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--max-rounds", type=int, default=1000)
    p.add_argument("--memory-budget", type=memory_size, default=0,
                   help="polar_memory_budget: bytes, or 512M, 1.5G (default: none)")
    p.add_argument("--json", type=Path, help="also write the raw results here")
    args = p.parse_args()
    in_namespace()
    res = run(args)
    if args.json:
        args.json.write_text(json.dumps(res, indent=1))
    print("\n".join(table(res)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
