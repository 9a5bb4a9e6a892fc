"""Reference server throughput on this CPU: tokens/s for sampled generation (KV-cache decoding) and for teacher
forcing a scripted reply (one forward pass), at a few prompt lengths; in-process, then once over HTTP on
127.0.0.1; then what a server start costs (to its ready line) as a process and forked from the warm fork server
(polar_serve/forkserver.py), in the same run. Bounded: under a minute on the tiny model.

    .venv/bin/python bench/serve.py [--model DIR] [--new-tokens N] [--threads N]
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
import torch  # noqa: E402

from bench.peers import proc_tree_cpu_ms  # noqa: E402
from polar_serve.engine import Engine  # noqa: E402
from polar_serve.forkserver import ENV_VAR as FORKSERVER_ENV  # noqa: E402
from polar_serve.launch import reference_server  # noqa: E402
from polar_serve.sampling import SamplingParams  # noqa: E402
from polar_serve.sequence import Sequence  # noqa: E402

PROMPT_LENGTHS = (16, 256, 1024)
REPEATS = 3
STARTS = 5


def timed_run(engine: Engine, prompt: list[int], params: SamplingParams, forced: list[int] | None) -> float:
    """Best-of-REPEATS seconds to produce the whole output."""
    best = float("inf")
    for _ in range(REPEATS):
        seq = Sequence(engine, prompt, params, forced)
        t0 = time.perf_counter()
        seq.start()
        while not seq.finished:
            seq.step()
        best = min(best, time.perf_counter() - t0)
    return best


def bench_engine(model: Path, new_tokens: int) -> None:
    engine = Engine(model)
    params = SamplingParams(max_new_tokens=new_tokens, temperature=1.0, seed=0, ignore_eos=True)
    reply = engine.encode("I will run the tests now. " * new_tokens)[: new_tokens - 1] + [engine.eos_token_ids[0]]
    timed_run(engine, [1, 2, 3], params, reply)  # warm-up: first calls pay for lazy initialisation
    print(f"in-process, {model.name}, {torch.get_num_threads()} torch thread(s), {new_tokens} new tokens")
    print(f"{'prompt':>8} {'generate tok/s':>15} {'ms/token':>9} {'teacher-force tok/s':>20} {'ms/reply':>9}")
    for n in PROMPT_LENGTHS:
        prompt = [(7 * i + 11) % engine.vocab_size for i in range(n)]
        gen = timed_run(engine, prompt, params, None)
        forced = timed_run(engine, prompt, params, reply)
        print(f"{n:>8} {new_tokens / gen:>15.0f} {1000 * gen / new_tokens:>9.2f} "
              f"{len(reply) / forced:>20.0f} {1000 * forced:>9.1f}")


def bench_http(model: Path, new_tokens: int) -> None:
    body = {"input_ids": list(range(10, 266)), "return_logprob": True,
            "sampling_params": {"max_new_tokens": new_tokens, "ignore_eos": True, "seed": 0}}
    with reference_server(model) as base, httpx.Client(base_url=base, timeout=60) as client:
        client.post("/generate", json=body)  # warm-up
        t0 = time.perf_counter()
        for _ in range(REPEATS):
            assert len(client.post("/generate", json=body).json()["output_ids"]) == new_tokens
        elapsed = (time.perf_counter() - t0) / REPEATS
    print(f"over HTTP (/generate, 256-token prompt): {new_tokens / elapsed:.0f} tok/s, "
          f"{1000 * elapsed:.0f} ms per request")


def starts(model: Path) -> tuple[float, float]:
    """Median (wall s to the ready line, CPU-s of the server by then) over STARTS starts."""
    walls, cpus = [], []
    for _ in range(STARTS):
        pids: list[int] = []
        t0 = time.perf_counter()
        with reference_server(model, on_start=pids.append):
            walls.append(time.perf_counter() - t0)
            cpus.append(proc_tree_cpu_ms(pids[0]) / 1000)
    return statistics.median(walls), statistics.median(cpus)


def bench_start(model: Path) -> None:
    os.environ.pop(FORKSERVER_ENV, None)
    process = starts(model)
    with tempfile.TemporaryDirectory(prefix="polar-bench-fork-") as tmp:
        path = Path(tmp) / "socket"
        t0 = time.perf_counter()
        server = subprocess.Popen([sys.executable, "-m", "polar_serve.forkserver", "--socket", str(path)],
                                  stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        assert server.stdout is not None and server.stdout.readline().startswith("polar serve forkserver")
        own = time.perf_counter() - t0, proc_tree_cpu_ms(server.pid) / 1000
        os.environ[FORKSERVER_ENV] = str(path)
        try:
            forked = starts(model)
        finally:
            os.environ.pop(FORKSERVER_ENV, None)
            server.terminate()
            server.wait(30)
    print(f"server start to its ready line (median of {STARTS}): process {process[0]:.2f} s, {process[1]:.2f} CPU-s; "
          f"forked {forked[0]:.2f} s, {forked[1]:.2f} CPU-s ({process[1] / max(forked[1], 0.01):.0f}x less CPU; "
          f"the fork server's own start, once: {own[0]:.2f} s, {own[1]:.2f} CPU-s)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=ROOT / "fixtures" / "tiny-qwen2")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (the server's default is 1)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    bench_engine(args.model, args.new_tokens)
    bench_http(args.model, args.new_tokens)
    bench_start(args.model)
    return 0


if __name__ == "__main__":
    sys.exit(main())
