"""Polar's proxy side by side with its peers, in front of a zero-compute engine (bench/stub_engine.py),
measured in one run, with one closed-loop load driver, inside a loopback-only network namespace:

  direct   the stub engine itself (OpenAI chat)
  bare     mitmdump as a plain reverse proxy, no addon
  polar    mitmdump + Polar's addon (chat -> the engine's /generate, tokens captured)
  litellm  LiteLLM's proxy (`openai/` provider, one worker), from .tools/litellm-venv (bench/setup_litellm.sh)

For each: CPU per call in the proxy's processes (/proc/<pid>/stat, the process and its children),
p50 latency at concurrency 1, calls/s at concurrency 8 (non-streamed chat calls), and the streaming time
to the first content token with the engine at a fixed delay per token. Ratios are against `bare` (and
`direct` for time to first token) measured in the same run.

    .venv/bin/python bench/peers.py [--quick] [--json OUT.json]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Iterator

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import aiohttp  # noqa: E402

from polar_mitm.launch import free_port, proxy_process, stop, wait_for_port  # noqa: E402

MODEL = ROOT / "fixtures" / "tiny-qwen2"
LITELLM = ROOT / ".tools" / "litellm-venv" / "bin" / "litellm"
REPLY = "ok, next step"
TOKEN_DELAY_MS = 20.0
STREAM_TOKENS = 16


def in_namespace() -> None:
    """Re-run this script inside a fresh loopback-only network namespace (unless already in one)."""
    if os.environ.get("POLAR_NETNS") == "1":
        return
    ns = ["unshare", "-n"] if os.getuid() == 0 else ["unshare", "-rn"]
    cmd = [*ns, "bash", "-c", 'ip link set lo up && exec "$@"', "_", sys.executable, *sys.argv]
    os.execvpe(cmd[0], cmd, dict(os.environ, POLAR_NETNS="1", HF_HUB_OFFLINE="1"))


def proc_tree_cpu_ms(pid: int) -> float:
    """User + system CPU of a process and its live descendants, in ms: each process's own CPU clock (ns, every
    thread, those that ended too), not /proc's 10 ms ticks, which made a window of a few calls a coin toss."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    total, todo = 0.0, [pid]
    while todo:
        p = todo.pop()
        try:
            total += time.clock_gettime(((~p) << 3) | 2) * 1000  # CPUCLOCK_SCHED of process p (clock_getcpuclockid)
        except OSError:
            continue  # it ended
        todo.extend(children.get(p, []))
    return total


def chat_body(stream: bool, tokens: int) -> dict:
    return {"model": "tiny", "max_tokens": tokens, "temperature": 0, "stream": stream,
            "messages": [{"role": "system", "content": "You are a coding agent."},
                         {"role": "user", "content": "list the files, then stop"}]}


async def closed_loop(url: str, concurrency: int, calls: int | None, seconds: float | None,
                      key: str | None = None) -> list[float]:
    """Latencies (ms) of non-streamed chat calls, `concurrency` clients each sending its next call when the
    last one is answered, until `calls` calls or `seconds` have passed."""
    latencies: list[float] = []
    deadline = time.perf_counter() + seconds if seconds else None
    body = json.dumps(chat_body(False, 8)).encode()
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as http:
        async def worker(k: int) -> None:
            headers = {"authorization": f"Bearer {key or f'w{k}'}", "content-type": "application/json"}
            while (calls is None or len(latencies) < calls) and (deadline is None or time.perf_counter() < deadline):
                t = time.perf_counter()
                async with http.post(url, data=body, headers=headers) as r:
                    await r.read()
                    if r.status != 200:
                        raise RuntimeError(f"{url}: {r.status} {(await r.text())[:300]}")
                latencies.append((time.perf_counter() - t) * 1000)

        await asyncio.gather(*(worker(k) for k in range(concurrency)))
    return latencies


async def first_token_ms(url: str, body: dict, repeats: int, key: str | None = None) -> float:
    """Median time from sending a streamed call to the first event carrying content (or output ids)."""
    times = []
    async with aiohttp.ClientSession() as http:
        for i in range(repeats):
            t = time.perf_counter()
            first = None
            async with http.post(url, json=body, headers={"authorization": f"Bearer {key or f'ttft{i}'}"}) as r:
                async for line in r.content:
                    if first is None and _has_token(line):
                        first = time.perf_counter()
            if first is None:
                raise RuntimeError(f"{url}: the stream carried no token")
            times.append((first - t) * 1000)
    return statistics.median(times)


def _has_token(line: bytes) -> bool:
    if not line.startswith(b"data:") or line[5:].strip() in (b"", b"[DONE]"):
        return False
    event = json.loads(line[5:])
    if "output_ids" in event:
        return bool(event["output_ids"])
    return any((c.get("delta") or {}).get("content") for c in event.get("choices") or [])


def measure(name: str, url: str, pid: int, sizes: dict, key: str | None = None) -> dict:
    """One path at concurrency 1 and 8. `key`: the API key every call sends (default: one per client,
    which Polar's open mode takes as the session)."""
    return measure_in_turns({name: (url, pid)}, sizes, 1, key)[name]


def measure_in_turns(paths: dict[str, tuple[str, int]], sizes: dict, rounds: int,
                     key: str | None = None) -> dict[str, dict]:
    """measure's row for each path (name -> (url, pid)), the paths taking turns `rounds` times (c1, then c8, each
    round a `rounds`-th of the calls or seconds): CPU per call is the median round, and `cpu_ms_per_round` keeps
    each, so two paths can be compared round by round, measured seconds rather than minutes apart."""
    for url, _pid in paths.values():
        asyncio.run(closed_loop(url, 8, sizes["warm"], None, key))
    samples: dict[str, dict[str, list]] = {name: {"c1": [], "c8": []} for name in paths}
    for _ in range(rounds):
        for conc, calls, seconds in ((1, sizes["c1"] // rounds, None), (8, None, sizes["c8_s"] / rounds)):
            for name, (url, pid) in paths.items():
                cpu0, t0 = proc_tree_cpu_ms(pid), time.perf_counter()
                lat = asyncio.run(closed_loop(url, conc, calls, seconds, key))
                samples[name][f"c{conc}"].append(((proc_tree_cpu_ms(pid) - cpu0) / len(lat),
                                                  time.perf_counter() - t0, lat))
    rows = {}
    for name, by_conc in samples.items():
        row: dict = {"path": name}
        for c, taken in by_conc.items():
            lat = sorted(x for _cpu, _s, lats in taken for x in lats)
            cpu = [cpu for cpu, _s, _l in taken]
            row[c] = {"calls": len(lat), "calls_per_s": len(lat) / sum(s for _cpu, s, _l in taken),
                      "cpu_ms_per_call": statistics.median(cpu), "cpu_ms_per_round": cpu,
                      "p50_ms": statistics.median(lat), "p99_ms": lat[int(0.99 * (len(lat) - 1))]}
        c1, c8 = row["c1"], row["c8"]
        print(f"  {name:<8} c1 p50 {c1['p50_ms']:6.2f} ms, CPU {c1['cpu_ms_per_call']:5.2f} ms/call | "
              f"c8 {c8['calls_per_s']:5.0f} calls/s, CPU {c8['cpu_ms_per_call']:5.2f} ms/call", flush=True)
        rows[name] = row
    return rows


@contextmanager
def service(cmd: list[str], port: int, log: Path, env: dict | None = None, timeout: float = 60) -> Iterator[int]:
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env or os.environ, cwd=log.parent)
    try:
        wait_for_port(port, proc, log, timeout=timeout)
        yield proc.pid
    finally:
        stop(proc)


def stub_command(port: int, token_delay_ms: float = 0.0, ids: list[int] | None = None) -> list[str]:
    """bench/stub_engine.py on 127.0.0.1:`port`, answering REPLY (`ids`: its token ids), each streamed token
    `token_delay_ms` after the last."""
    ids = reply_ids() if ids is None else ids
    return [sys.executable, str(ROOT / "bench" / "stub_engine.py"), "--port", str(port), "--reply-ids",
            ",".join(map(str, ids)), "--reply-text", REPLY, "--token-delay-ms", f"{token_delay_ms:g}"]


def reply_ids() -> list[int]:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(MODEL / "tokenizer.json"))
    return tok.encode(REPLY).ids + [tok.token_to_id("<|im_end|>")]


def litellm_config(tmp: Path, engine: str) -> Path:
    cfg = tmp / "litellm.yaml"
    cfg.write_text(f"model_list:\n  - model_name: tiny\n    litellm_params:\n      model: openai/tiny\n"
                   f"      api_base: {engine}/v1\n      api_key: sk-stub\n"
                   f"litellm_settings:\n  telemetry: false\n")
    return cfg


@contextmanager
def litellm_service(tmp: Path, engine: str) -> Iterator[tuple[int, str, str]]:
    """LiteLLM's proxy in front of `engine`, one worker: (pid, base URL, the key its calls must send)."""
    port = free_port()
    key = "sk-bench-" + secrets.token_hex(16)  # LiteLLM refuses to start without a master key
    env = dict(os.environ, LITELLM_LOCAL_MODEL_COST_MAP="True", LITELLM_TELEMETRY="False",
               NO_DOCS="True", DISABLE_ADMIN_UI="True", LITELLM_MASTER_KEY=key)
    cmd = [str(LITELLM), "--config", str(litellm_config(tmp, engine)), "--host", "127.0.0.1",
           "--port", str(port), "--num_workers", "1"]
    with service(cmd, port, tmp / "litellm.log", env, timeout=180) as pid:
        yield pid, f"http://127.0.0.1:{port}", key


def run(sizes: dict) -> dict:
    results: dict = {"machine": machine(), "token_delay_ms": TOKEN_DELAY_MS, "rows": [], "ttft_ms": {}}
    chat = "/v1/chat/completions"
    stream_body = chat_body(True, STREAM_TOKENS)
    with tempfile.TemporaryDirectory(prefix="polar-peers-") as tmp_s, ExitStack() as stack:
        tmp = Path(tmp_s)
        ids = reply_ids()
        stub_port = free_port()
        stub_pid = stack.enter_context(service(stub_command(stub_port, TOKEN_DELAY_MS, ids), stub_port,
                                               tmp / "stub.log"))
        engine = f"http://127.0.0.1:{stub_port}"
        print(f"peers: stub engine {engine}, {len(ids)} reply tokens, streamed at {TOKEN_DELAY_MS:g} ms/token", flush=True)
        results["rows"].append(measure("direct", engine + chat, stub_pid, sizes))
        results["ttft_ms"]["direct"] = asyncio.run(first_token_ms(engine + chat, stream_body, sizes["ttft"]))
        results["ttft_ms"]["direct_generate"] = asyncio.run(first_token_ms(
            engine + "/generate", {"input_ids": [1, 2, 3], "stream": True, "sampling_params": {}}, sizes["ttft"]))

        bare_port = free_port()
        mitmdump = str(Path(sys.executable).parent / "mitmdump")
        bare_cmd = [mitmdump, "-q", "--mode", f"reverse:{engine}@127.0.0.1:{bare_port}",
                    "--set", f"confdir={tmp / 'bare-mitm'}"]
        with service(bare_cmd, bare_port, tmp / "bare.log") as pid:
            results["rows"].append(measure("bare", f"http://127.0.0.1:{bare_port}{chat}", pid, sizes))

        with proxy_process(tmp / "polar", engine, MODEL) as proxy:
            results["rows"].append(measure("polar", proxy.base_url + chat, proxy.pid, sizes))
            results["ttft_ms"]["polar"] = asyncio.run(first_token_ms(proxy.base_url + chat, stream_body, sizes["ttft"]))
            results["polar_capture_bytes"] = sum(  # the session files and the shared prefixes in _shared/
                p.stat().st_size for p in proxy.capture_dir.rglob("*") if p.is_file())

        if LITELLM.exists():
            with litellm_service(tmp, engine) as (pid, url, key):
                results["rows"].append(measure("litellm", url + chat, pid, sizes, key))
                results["ttft_ms"]["litellm"] = asyncio.run(first_token_ms(url + chat, stream_body, sizes["ttft"], key))
            results["litellm_version"] = litellm_version()
        else:
            print(f"peers: LiteLLM skipped: {LITELLM} is not installed (make bench runs bench/setup_litellm.sh)")
    return results


def litellm_version() -> str:
    found = sorted(LITELLM.parents[1].glob("lib/python*/site-packages/litellm-*.dist-info"))
    return found[0].name.removesuffix(".dist-info").split("-")[1] if found else "?"


def machine() -> dict:
    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), platform.processor())
    return {"cpu": model, "cores": os.cpu_count(), "python": platform.python_version(),
            "kernel": platform.release(), "load_1min": os.getloadavg()[0]}


def table(results: dict) -> list[str]:
    rows = {r["path"]: r for r in results["rows"]}
    bare = rows.get("bare")
    out = ["| path | CPU ms/call (c1) | CPU ms/call (c8) | ×bare (c8) | calls/s c8 | p50 ms c1 | p99 ms c1 |",
           "|---|---|---|---|---|---|---|"]
    for name, r in rows.items():
        ratio = f"{r['c8']['cpu_ms_per_call'] / bare['c8']['cpu_ms_per_call']:.2f}" if bare and name != "direct" else "–"
        out.append(f"| {name} | {r['c1']['cpu_ms_per_call']:.2f} | {r['c8']['cpu_ms_per_call']:.2f} | {ratio} | "
                   f"{r['c8']['calls_per_s']:.0f} | {r['c1']['p50_ms']:.2f} | {r['c1']['p99_ms']:.2f} |")
    t = results["ttft_ms"]
    line = (f"Streaming, engine at {results['token_delay_ms']:g} ms/token, median time to first content token: "
            f"direct {t['direct']:.1f} ms (engine /generate {t['direct_generate']:.1f} ms)")
    for name in ("polar", "litellm"):
        if name in t:
            line += f", {name} {t[name]:.1f} ms ({t[name] - t['direct']:+.1f} ms)"
    return out + ["", line + "."]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="a few calls per phase (a smoke run)")
    ap.add_argument("--json", type=Path, help="also write the raw results here")
    args = ap.parse_args()
    in_namespace()
    sizes = ({"warm": 16, "c1": 20, "c8_s": 1.0, "ttft": 2} if args.quick
             else {"warm": 100, "c1": 300, "c8_s": 5.0, "ttft": 10})
    results = run(sizes)
    print("\n".join(table(results)))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
