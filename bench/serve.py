"""Reference server throughput on this CPU: tokens/s for sampled generation (KV-cache decoding) and for teacher
forcing a scripted reply (one forward pass), at a few prompt lengths; in-process, then once over HTTP on
127.0.0.1. Bounded: a few seconds on the tiny model.

    .venv/bin/python bench/serve.py [--model DIR] [--new-tokens N] [--threads N]
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
import torch  # noqa: E402

from polar_serve.engine import Engine  # noqa: E402
from polar_serve.launch import reference_server  # noqa: E402
from polar_serve.sampling import SamplingParams  # noqa: E402
from polar_serve.sequence import Sequence  # noqa: E402

PROMPT_LENGTHS = (16, 256, 1024)
REPEATS = 3


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=ROOT / "fixtures" / "tiny-qwen2")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (the server's default is 1)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    bench_engine(args.model, args.new_tokens)
    bench_http(args.model, args.new_tokens)
    return 0


if __name__ == "__main__":
    sys.exit(main())
