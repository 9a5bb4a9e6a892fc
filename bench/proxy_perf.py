"""The proxy-performance table of issue 30, measured in one run beside bare mitmdump and LiteLLM (when
installed: `make bench` does; loopback namespace, the zero-compute stub engine of bench/stub_engine.py):

  tiny body       CPU per non-streamed call (c1, c8) and calls/s at c8: bare mitmdump vs Polar vs LiteLLM
  streaming       time to the first content token, engine at 20 ms/token: direct vs Polar vs LiteLLM
  realistic body  a synthetic qwen-code-like first call (~75 KB of JSON: a long system prompt and 24 tool
                  schemas; no recorded one is in fixtures/), sent as the first call of fresh sessions:
                  Polar CPU per call (the shared prefix comes from the cache after the first), bare's for
                  the same bodies, and capture bytes per first call
  growing session the same body then 100 turns (reply + a 1.5 KB tool result each): Polar CPU per call at
                  turns 96-100 vs turn 1 and vs bare forwarding the same bodies; capture bytes ÷ the floor
                  (bench/captures.py: distinct ids + logprobs + last request + replies)
  K proxies       calls/s of 1, 2 and 4 proxy processes side by side (a node's POLAR_PROXIES), 16 clients
                  spread over them, each client a session of its own
  pi session      a real pi session through `polar run` (~20 calls), its capture bytes ÷ the floor
  trajectory build  from bench/traj.py of the same `make bench` run (bench/results.py adds the row)

Bare mitmdump and Polar run side by side for the tiny and realistic bodies and take turns, 5 rounds each: CPU per
call is the median round, and the tiny body's ratio the median of the rounds' ratios, so it does not depend on
how fast the machine was in one minute or the next.

    .venv/bin/python bench/proxy_perf.py [--quick] [--json OUT.json]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import aiohttp  # noqa: E402

from bench.captures import floor_bytes  # noqa: E402
from bench.peers import (LITELLM, MODEL, REPLY, STREAM_TOKENS, TOKEN_DELAY_MS, litellm_version,  # noqa: E402
                         chat_body, closed_loop, first_token_ms, in_namespace, litellm_service, machine, measure,
                         measure_in_turns, proc_tree_cpu_ms, service, stub_command)
from polar_mitm.launch import free_port, proxy_process  # noqa: E402
from polar_mitm.sessions.registry import hashed_id  # noqa: E402
from polar_traj.capture_reader import read_capture  # noqa: E402

CHAT = "/v1/chat/completions"


def realistic_body(user: str, seed: int = 7) -> dict:
    """A first call shaped like qwen-code's: ~75 KB of JSON, a long system prompt and 24 tool schemas."""
    rnd = random.Random(seed)
    words = ("the file path command output agent tool shell read write edit search pattern directory project "
             "user must should never always when before after test build run error result line").split()

    def para(n: int) -> str:
        return " ".join(rnd.choice(words) for _ in range(n)) + "."

    system = "You are Qwen Code, an interactive CLI agent for software engineering tasks.\n\n" + "\n\n".join(
        f"## Rule {i}\n" + para(60) for i in range(80))
    tools = [{"type": "function", "function": {
        "name": f"tool_{i}", "description": para(80),
        "parameters": {"type": "object", "required": ["arg_0"], "properties": {
            f"arg_{j}": {"type": rnd.choice(["string", "integer", "boolean"]), "description": para(25)}
            for j in range(6)}}}} for i in range(24)]
    return {"model": "tiny", "stream": False, "max_tokens": 8, "temperature": 0, "tools": tools,
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}]}


async def send_all(url: str, calls: list[tuple[str, bytes]], key: str | None = None) -> list[dict]:
    """Each (session key, body) in order, one at a time; the replies. `key`: the one key every call sends instead
    (LiteLLM's master key)."""
    out = []
    async with aiohttp.ClientSession() as http:
        for session, body in calls:
            headers = {"authorization": f"Bearer {key or session}", "content-type": "application/json"}
            async with http.post(url, data=body, headers=headers) as r:
                if r.status != 200:
                    raise RuntimeError(f"{url}: {r.status} {(await r.text())[:300]}")
                out.append(await r.json())
    return out


def cpu_ms(pid: int, url: str, calls: list[tuple[str, bytes]], key: str | None = None) -> float:
    """CPU of the proxy's processes per call over these calls."""
    before = proc_tree_cpu_ms(pid)
    asyncio.run(send_all(url, calls, key))
    return (proc_tree_cpu_ms(pid) - before) / len(calls)


def first_calls(n: int) -> list[tuple[str, bytes]]:
    return [(f"first-{i}", json.dumps(realistic_body(f"Task {i}: fix the failing test in tests/test_{i}.py")).encode())
            for i in range(n)]


def growing(turns: int) -> list[tuple[str, bytes]]:
    body = realistic_body("Fix the failing test in tests/test_parser.py")
    calls = []
    for turn in range(turns):
        calls.append(("grow", json.dumps(body).encode()))
        body = {**body, "messages": body["messages"] + [
            {"role": "assistant", "content": REPLY},
            {"role": "user", "content": f"tool output {turn}:\n" + "src/parser.py:12: ok\n" * 70}]}
    return calls


def pi_session(tmp: Path, seconds: float) -> dict | None:
    """A real pi session through `polar run` (the reference server with a policy that asks for one more shell
    call each turn, until the timeout): its capture's bytes against the floor; None when pi cannot run here."""
    out = tmp / "pi-run"
    cmd = [str(Path(sys.executable).parent / "polar"), "run", "--adapter", "pi", "--instruction",
           "List the files, then keep checking them", "--policy", str(ROOT / "fixtures/policies/loop-shell.yaml"),
           "--timeout", str(seconds), "--out", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 300)
    files = sorted((out / "captures").glob("*/*.jsonl"))
    if not files:
        print(f"proxy_perf: the pi session left no capture (exit {done.returncode}): {done.stdout[-500:]}"
              f"{done.stderr[-500:]}")
        return None
    records = list(read_capture(files[0]))
    return {"calls": len(records), "bytes": files[0].stat().st_size, "floor": floor_bytes(records)["floor"]}


def window(pid: int, url: str, calls: list[tuple[str, bytes]], first: int, last: int) -> float:
    """Send calls[:last] in order; the CPU per call of calls[first:last] (calls are ~ms: a window of 5)."""
    asyncio.run(send_all(url, calls[:first]))
    return cpu_ms(pid, url, calls[first:last])


async def spread(urls: list[str], clients: int, seconds: float) -> float:
    """Calls/s of `clients` closed-loop clients split evenly over `urls`, for `seconds`."""
    done = await asyncio.gather(*(closed_loop(u, clients // len(urls), None, seconds) for u in urls))
    return sum(len(lat) for lat in done) / seconds


def scaling(tmp: Path, engine: str, sizes: dict) -> dict[str, float]:
    """Calls/s per node with K = 1, 2, 4 proxy processes (what POLAR_PROXIES starts), the same 16 clients;
    keyed by K as text, as the results come back from JSON."""
    out = {}
    for k in (1, 2, 4):
        with ExitStack() as stack:
            urls = [stack.enter_context(proxy_process(tmp / f"k{k}-{i}", engine, MODEL)).base_url + CHAT
                    for i in range(k)]
            asyncio.run(spread(urls, 16, 1.0))  # warm: each proxy's first calls load its tokenizer caches
            out[str(k)] = asyncio.run(spread(urls, 16, sizes["c8_s"]))
            print(f"  {k} proxies: {out[str(k)]:.0f} calls/s", flush=True)
    return out


ROUNDS = 5  # bare and Polar alternate this many times: this machine's speed drifts between runs minutes apart


def run(sizes: dict) -> dict:
    res: dict = {"machine": machine(), "token_delay_ms": TOKEN_DELAY_MS, "rows": [], "ttft_ms": {}, "sizes": sizes}
    turns, n_first = sizes["turns"], sizes["first"]
    grow = growing(turns)
    with tempfile.TemporaryDirectory(prefix="polar-perf-") as tmp_s, ExitStack() as stack:
        tmp = Path(tmp_s)
        stub_port = free_port()
        stack.enter_context(service(stub_command(stub_port, TOKEN_DELAY_MS), stub_port, tmp / "stub.log"))
        engine = f"http://127.0.0.1:{stub_port}"
        stream_body = chat_body(True, STREAM_TOKENS)
        res["ttft_ms"]["direct"] = asyncio.run(first_token_ms(engine + CHAT, stream_body, sizes["ttft"]))

        def bare_cmd(port: int, *extra: str) -> list[str]:
            return [str(Path(sys.executable).parent / "mitmdump"), "-q", "--mode",
                    f"reverse:{engine}@127.0.0.1:{port}", "--set", f"confdir={tmp / 'bare-mitm'}", *extra]

        bare_port = free_port()
        # the tiny model says 4096 tokens of context; a 30k-token prompt needs a larger one
        with service(bare_cmd(bare_port), bare_port, tmp / "bare.log") as bare_pid, \
                proxy_process(tmp / "polar", engine, MODEL, "--set", "polar_context_length=262144") as proxy:
            bare_url, url = f"http://127.0.0.1:{bare_port}{CHAT}", proxy.base_url + CHAT
            rows = measure_in_turns({"bare": (bare_url, bare_pid), "polar": (url, proxy.pid)}, sizes, ROUNDS)
            res["rows"] += [rows["bare"], rows["polar"]]
            calls = first_calls(n_first + 1)
            asyncio.run(send_all(url, calls[:1]))  # the first session ever: its prefix enters the cache
            bare_first, polar_first = [], []
            for chunk in (calls[1 + k::ROUNDS] for k in range(min(ROUNDS, n_first))):  # the same bodies, in turn
                bare_first.append(cpu_ms(bare_pid, bare_url, chunk))
                polar_first.append(cpu_ms(proxy.pid, url, chunk))
            res["bare_first_cpu_ms"], res["polar_first_cpu_ms"] = (statistics.median(bare_first),
                                                                    statistics.median(polar_first))
            res["bare_turn_cpu_ms"] = window(bare_pid, bare_url, grow, turns - 5, turns)
            res["ttft_ms"]["polar"] = asyncio.run(first_token_ms(url, stream_body, sizes["ttft"]))
            local = proxy.capture_dir / "local"
            res["polar_first_capture_bytes"] = statistics.median(
                (local / f"{hashed_id(key)}.jsonl").stat().st_size for key, _ in calls[1:])
            shared = sorted((proxy.capture_dir / "_shared").glob("*.json"))  # the preamble, stored once per proxy
            res["polar_shared_files"] = [f.stat().st_size for f in shared]
            res["polar_first_session_bytes"] = (local / f"{hashed_id(calls[0][0])}.jsonl").stat().st_size
            res["polar_turn1_cpu_ms"] = cpu_ms(proxy.pid, url, grow[:1])
            res["polar_turn_cpu_ms"] = window(proxy.pid, url, grow[1:], turns - 6, turns - 1)
            grown = local / f"{hashed_id('grow')}.jsonl"
            records = list(read_capture(grown))
            floor = floor_bytes(records)["floor"]
            res["grow"] = {"calls": len(records), "bytes": grown.stat().st_size, "floor": floor,
                           "substituted": sum(r.prefix_source == "substituted" for r in records),
                           "final_prompt_tokens": len(records[-1].prompt_ids)}
        stream_port = free_port()
        with service(bare_cmd(stream_port, "--set", "stream_large_bodies=1"), stream_port, tmp / "bare-stream.log"):
            # mitmdump buffers a body whole unless told to stream it: what a streaming call costs through it
            res["ttft_ms"]["bare"] = asyncio.run(first_token_ms(f"http://127.0.0.1:{stream_port}{CHAT}",
                                                                stream_body, sizes["ttft"]))
        if LITELLM.exists():  # the same tiny-body, streaming and realistic-body figures for LiteLLM
            with litellm_service(tmp, engine) as (pid, base, key):
                url = base + CHAT
                res["rows"].append(measure("litellm", url, pid, sizes, key))
                res["ttft_ms"]["litellm"] = asyncio.run(first_token_ms(url, stream_body, sizes["ttft"], key))
                res["litellm_first_cpu_ms"] = cpu_ms(pid, url, first_calls(n_first), key)
            res["litellm_version"] = litellm_version()
        else:
            print(f"proxy_perf: LiteLLM skipped: {LITELLM} is not installed (make bench runs bench/setup_litellm.sh)")
        res["scaling"] = scaling(tmp, engine, sizes)
        res["pi"] = pi_session(tmp, sizes["pi_s"])
    return res


def table(res: dict, traj: list[dict] | None = None) -> list[str]:
    """The issue's table; `traj`: bench/traj.py's rows from the same run, for the trajectory-build row."""
    rows = {r["path"]: r for r in res["rows"]}
    bare, polar, lite = rows["bare"], rows["polar"], rows.get("litellm")
    g = res["grow"]

    def cpu(row: dict, c: str) -> float:
        return row[c]["cpu_ms_per_call"]

    def x_bare(c: str) -> float:
        """Polar ÷ bare: the median of the rounds' ratios (each round's two paths measured seconds apart)."""
        pairs = list(zip(polar[c].get("cpu_ms_per_round", []), bare[c].get("cpu_ms_per_round", [])))
        return statistics.median(p / b for p, b in pairs) if pairs else cpu(polar, c) / cpu(bare, c)

    lite_cpu = f", LiteLLM {cpu(lite, 'c1'):.2f} / {cpu(lite, 'c8'):.2f} ms" if lite else ""
    lite_first = f", LiteLLM {res['litellm_first_cpu_ms']:.1f} ms" if lite else ""
    lite_rate = f", LiteLLM {lite['c8']['calls_per_s']:.0f}" if lite else ""
    ttft = res["ttft_ms"]
    peers_ttft = [f"{name} {ttft[key] - ttft['direct']:+.1f} ms" for key, name in (("bare", "bare mitmdump streaming"),
                                                                                ("litellm", "LiteLLM")) if key in ttft]
    ttft_peers = f" ({', '.join(peers_ttft)})" if peers_ttft else ""
    shared = res.get("polar_shared_files") or []
    shared_text = (f"; the shared preamble: {len(shared)} file of {shared[0] / 1e3:.0f} KB per proxy, the first "
                   f"session {res['polar_first_session_bytes'] / 1e3:.0f} KB" if len(shared) == 1 else
                   f"; {len(shared)} shared files" if shared else "")
    r = [("proxy CPU per non-streamed call ÷ bare mitmdump, tiny body, c1 / c8",
          f"{x_bare('c1'):.2f}× / {x_bare('c8'):.2f}× "
          f"(Polar {cpu(polar, 'c1'):.2f} / {cpu(polar, 'c8'):.2f} ms, bare {cpu(bare, 'c1'):.2f} / "
          f"{cpu(bare, 'c8'):.2f} ms{lite_cpu})", "≤ 1.3×"),
         ("first call of a session, realistic body (75 KB, synthetic): proxy CPU per call",
          f"{res['polar_first_cpu_ms']:.1f} ms (bare {res['bare_first_cpu_ms']:.1f} ms{lite_first})", "≤ 10 ms"),
         ("later calls of such a session (history substituted, turns 96-100) ÷ bare forwarding the same body",
          f"{res['polar_turn_cpu_ms'] / res['bare_turn_cpu_ms']:.2f}× (Polar {res['polar_turn_cpu_ms']:.1f} ms, "
          f"bare {res['bare_turn_cpu_ms']:.1f} ms)", "≤ 3×"),
         ("capture bytes per first call of such a session (sessions 2-N)",
          f"{res['polar_first_capture_bytes'] / 1e3:.1f} KB{shared_text}", "≤ 20 KB"),
         ("calls/s on one proxy process at c8",
          f"{polar['c8']['calls_per_s']:.0f} (bare {bare['c8']['calls_per_s']:.0f}{lite_rate}; Polar ÷ bare "
          f"{polar['c8']['calls_per_s'] / bare['c8']['calls_per_s']:.2f})", "≥ 650"),
         ("streaming first token, proxy − direct, engine 20 ms/token",
          f"{res['ttft_ms']['polar'] - res['ttft_ms']['direct']:+.1f} ms{ttft_peers}", "≤ +3 ms"),
         (f"capture bytes of a {g['calls']}-call growing session ÷ floor",
          f"{g['bytes'] / g['floor']:.2f}× ({g['bytes'] / 1e6:.2f} MB, floor {g['floor'] / 1e6:.2f} MB)", "≤ 1.2×"),
         *([("capture bytes of a real pi session (`polar run`, a shell call a turn) ÷ floor",
             f"{pi['bytes'] / pi['floor']:.2f}× ({pi['calls']} calls, {pi['bytes'] / 1e3:.0f} KB, floor "
             f"{pi['floor'] / 1e3:.0f} KB)", "≤ 1.2×")] if (pi := res.get("pi")) else []),
         (f"proxy CPU per call at turn {g['calls'] - 4}-{g['calls']} ÷ turn 1 of a growing "
          f"{g['final_prompt_tokens'] // 1000}k-token conversation",
          f"{res['polar_turn_cpu_ms'] / max(res['polar_turn1_cpu_ms'], 1e-9):.2f} (turn 1 {res['polar_turn1_cpu_ms']:.1f} ms)",
          "≤ 1.5"),
         ("calls/s per node with 1, 2, 4 proxy processes (zero-compute engine, 16 clients)",
          " / ".join(f"{res['scaling'][k]:.0f}" for k in ("1", "2", "4")) +
          f" ({res['scaling']['2'] / res['scaling']['1']:.2f}× and {res['scaling']['4'] / res['scaling']['1']:.2f}× "
          f"on {res['machine']['cores']} cores)", "near-linear to the core count")]
    if traj:
        r.append(traj_row(traj))
    out = ["| measure | measured | target |", "|---|---|---|"]
    out += [f"| {a} | {b} | {c} |" for a, b, c in r]
    if not lite:
        out.append("")
        out.append("(LiteLLM was not installed for this run: `make bench` installs it into .tools/litellm-venv.)")
    return out


def traj_row(rows: list[dict]) -> tuple[str, str, str]:
    """Issue 30's trajectory-build row from bench/traj.py's rows (the 100-turn case)."""
    from bench.traj import issue_figures

    f = issue_figures(rows)
    mb, gain = f["prefix_merge_mb_per_cpu_s"], f["per_request_x_before"]
    gains = " / ".join("–" if gain[n] is None else f"{gain[n]:.1f}×" for n in ("f1", "linear"))
    return (f"trajectory build at {f['turns']} turns (bench/traj.py, this run): prefix_merge MB of capture per "
            f"CPU second; per_request calls/cpu-s ÷ the baseline's (format 1 / linear)",
            f"{mb['f1']:.0f} / {mb['linear']:.0f} MB/s; {gains}", "≥ 300 MB/s; ≥ 5×")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="a few calls per phase (a smoke run)")
    ap.add_argument("--json", type=Path, help="also write the raw results here")
    args = ap.parse_args()
    in_namespace()
    sizes = ({"warm": 16, "c1": 20, "c8_s": 1.0, "ttft": 2, "first": 4, "turns": 20, "pi_s": 8} if args.quick
             else {"warm": 100, "c1": 300, "c8_s": 5.0, "ttft": 10, "first": 20, "turns": 100, "pi_s": 25})
    started = time.perf_counter()
    res = run(sizes)
    print("\n".join(table(res)))
    print(f"(load average {res['machine']['load_1min']:.1f} at the start; {time.perf_counter() - started:.0f} s)")
    if args.json:
        args.json.write_text(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
