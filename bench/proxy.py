"""Proxy overhead on this CPU, as ratios against the engine in the same run (loopback only, bounded):

1. latency of N concurrent non-streamed calls through the proxy (base URL, chat API) vs the same prompt
   ids sent straight to the engine's /generate: p50 and p99 ratio;
2. streaming time-to-first-token through the proxy vs direct;
3. proxy CPU per turn at turn 1-5 vs turn 46-50 of a growing conversation (history substitution keeps
   per-turn work flat apart from the unavoidable copy of the token list);
4. latency of one session's small calls while another session sends two 19 MiB bodies (refused: past the
   context; accepted: a large field the template does not render), as a ratio to the quiet case.

    .venv/bin/python bench/proxy.py [--calls 48] [--concurrency 8] [--turns 50]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

from polar_mitm.launch import proxy_process  # noqa: E402
from polar_serve.launch import reference_server  # noqa: E402
from polar_traj.capture_reader import read_capture, read_capture_dicts  # noqa: E402

MODEL = ROOT / "fixtures" / "tiny-qwen2"
NEW_TOKENS = 8


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return (time.perf_counter() - t) * 1000


def chat_body(text: str, stream: bool = False) -> dict:
    return {"model": "tiny", "max_tokens": NEW_TOKENS, "temperature": 0, "stream": stream,
            "messages": [{"role": "user", "content": text}]}


def latency(proxy, engine: str, calls: int, concurrency: int) -> None:
    client = httpx.Client(timeout=120)
    # the prompt ids the proxy sends, recorded once, so the direct calls ask the engine for the same work
    client.post(proxy.base_url + "/v1/chat/completions", json=chat_body("warm up the bench"),
                headers={"authorization": "Bearer k", "x-session-id": "ids"}).raise_for_status()

    ids = list(next(read_capture(proxy.capture_dir / "local" / "ids.jsonl")).prompt_ids)
    direct_body = {"input_ids": ids, "return_logprob": True,
                   "sampling_params": {"max_new_tokens": NEW_TOKENS, "temperature": 0}}

    def through(i: int) -> float:
        return timed(lambda: client.post(proxy.base_url + "/v1/chat/completions", json=chat_body("warm up the bench"),
                                         headers={"authorization": f"Bearer lat{i}"}).raise_for_status())

    def direct(_: int) -> float:
        return timed(lambda: client.post(engine + "/generate", json=direct_body).raise_for_status())

    with ThreadPoolExecutor(concurrency) as pool:
        d = list(pool.map(direct, range(calls)))
        p = list(pool.map(through, range(calls)))
    print(f"latency, {calls} non-streamed calls at concurrency {concurrency}, {NEW_TOKENS} new tokens:")
    print(f"  direct  p50 {pct(d, .5):7.1f} ms  p99 {pct(d, .99):7.1f} ms")
    print(f"  proxy   p50 {pct(p, .5):7.1f} ms  p99 {pct(p, .99):7.1f} ms")
    print(f"  ratio   p50 {pct(p, .5) / pct(d, .5):5.2f}x     p99 {pct(p, .99) / pct(d, .99):5.2f}x")


def first_byte_ms(client: httpx.Client, url: str, body: dict, headers: dict) -> float:
    t = time.perf_counter()
    first = None
    with client.stream("POST", url, json=body, headers=headers) as r:
        for chunk in r.iter_raw():
            if first is None and (b'"output_ids": [' in chunk or b'"content":' in chunk):
                first = time.perf_counter()  # the first chunk that carries a token
    if first is None:
        raise RuntimeError("stream produced no token")
    return (first - t) * 1000


def ttft(proxy, engine: str, repeats: int = 10) -> None:
    client = httpx.Client(timeout=120)
    direct_body = {"text": "time to first token", "stream": True, "return_logprob": True,
                   "sampling_params": {"max_new_tokens": 32, "temperature": 0}}
    d = [first_byte_ms(client, engine + "/generate", direct_body, {}) for _ in range(repeats)]
    body = {**chat_body("time to first token", stream=True), "max_tokens": 32}
    p = [first_byte_ms(client, proxy.base_url + "/v1/chat/completions", body, {"authorization": f"Bearer t{i}"})
         for i in range(repeats)]
    print(f"streaming time to first token ({repeats} runs, median): direct {statistics.median(d):.1f} ms, "
          f"proxy {statistics.median(p):.1f} ms, ratio {statistics.median(p) / statistics.median(d):.2f}x")


def small_call_ms(client: httpx.Client, proxy, n: int) -> float:
    return timed(lambda: client.post(proxy.base_url + "/v1/chat/completions", json=chat_body(f"small call {n}"),
                                     headers={"authorization": "Bearer quiet-neighbour"}).raise_for_status())


def noisy_neighbour(proxy, mib: int = 19) -> None:
    import threading

    client = httpx.Client(timeout=300)
    quiet = [small_call_ms(client, proxy, n) for n in range(10)]
    text = "word " * (mib * 2**20 // 5)
    print(f"latency of a small call while another session sends two {mib} MiB bodies:")
    for kind, body in (("refused", chat_body(text)), ("accepted", {**chat_body("hi"), "metadata": {"note": text}})):
        senders = [threading.Thread(target=lambda: httpx.post(
            proxy.base_url + "/v1/chat/completions", json=body, timeout=300,
            headers={"authorization": f"Bearer noisy-{kind}"})) for _ in range(2)]
        for t in senders:
            t.start()
        busy = []
        while any(t.is_alive() for t in senders) or len(busy) < 5:
            busy.append(small_call_ms(client, proxy, len(busy)))
        print(f"  {kind:8} quiet p50 {statistics.median(quiet):6.1f} ms, beside it worst {max(busy):7.1f} ms, "
              f"ratio {max(busy) / statistics.median(quiet):6.1f}x ({len(busy)} calls)")


def proc_cpu_ms(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * 1000 / os.sysconf("SC_CLK_TCK")


def cpu_per_turn(proxy, turns: int) -> None:
    client = httpx.Client(timeout=120)
    messages = [{"role": "system", "content": "You are a coding agent. " * 5},
                {"role": "user", "content": "start"}]
    cpu = []
    for turn in range(turns):
        before = proc_cpu_ms(proxy.pid)
        r = client.post(proxy.base_url + "/v1/chat/completions", headers={"authorization": "Bearer k", "x-session-id": "grow"},
                        json={"model": "tiny", "max_tokens": 16, "temperature": 0, "messages": messages})
        if r.status_code != 200:
            raise RuntimeError(f"turn {turn}: {r.status_code} {r.text[:300]}")
        cpu.append(proc_cpu_ms(proxy.pid) - before)
        reply = r.json()["choices"][0]["message"]["content"]
        messages += [{"role": "assistant", "content": reply},
                     {"role": "user", "content": f"tool output {turn}: " + "ls -la src " * 3}]

    records = list(read_capture_dicts(proxy.capture_dir / "local" / "grow.jsonl"))
    substituted = sum(r["prefix_source"] == "substituted" for r in records)
    early, late = statistics.mean(cpu[:5]), statistics.mean(cpu[-5:])
    print(f"proxy CPU per turn over a growing conversation ({turns} turns, {substituted} substituted, "
          f"final prompt {len(records[-1]['prompt_ids'])} tokens):")
    print(f"  turns 1-5 {early:.1f} ms, turns {turns - 4}-{turns} {late:.1f} ms, ratio {late / early:.2f}x "
          f"(CPU clock ticks are 10 ms; means over 5 turns)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=48)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--turns", type=int, default=50)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp, reference_server(MODEL) as engine:
        policy = Path(tmp) / "ok.yaml"
        policy.write_text("rules:\n  - name: ok\n    reply: 'ok, next step'\n")
        with proxy_process(Path(tmp) / "p", engine, MODEL) as proxy:
            latency(proxy, engine, args.calls, args.concurrency)
            ttft(proxy, engine)
            noisy_neighbour(proxy)
        with reference_server(MODEL, policy) as echo, proxy_process(Path(tmp) / "q", echo, MODEL) as proxy:
            cpu_per_turn(proxy, args.turns)
    return 0


if __name__ == "__main__":
    sys.exit(main())
