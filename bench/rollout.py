"""Rollout service throughput on this machine: samples per minute through real `celery -A workers worker`
nodes with 1 and then 2 run slots (worker concurrency), and per-sample overhead (queueing + prepare + evaluate
+ postrun + hand-offs between stages) beside the harness's own time. Real Redis, the reference server with the
tests' scripted coin policy, Pi in bubblewrap.

    .venv/bin/python bench/rollout.py [--samples 6] [--adapter pi]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import yaml  # noqa: E402

from workers.client import PolarClient  # noqa: E402
from polar.run.services import context_view  # noqa: E402
from polar_serve.launch import reference_server  # noqa: E402
from tests.redis_server import redis_server  # noqa: E402
from tests.workers.cluster import node_env, start_node  # noqa: E402

POLICY = ROOT / "tests" / "workers" / "rollout_policy.yaml"


def one_setting(slots: int, samples: int, adapter: str, tmp: Path, broker: str, engine: str, model: Path) -> dict:
    root = tmp / f"slots-{slots}"
    tasks = root / "tasks.yaml"
    root.mkdir()
    tasks.write_text(yaml.safe_dump({"tasks": [{
        "task_id": "coin", "instruction": "Flip the coin.", "adapter": adapter, "image": "host",
        "evaluator": {"command": "grep -qx heads coin.txt", "timeout_s": 30}, "timeout_s": 240,
        "submit": ["coin.txt"]}]}))
    node = start_node(node_env(broker, broker.rsplit("/", 1)[0] + "/0", engine, model, root, f"bench{slots}"),
                      concurrency=slots)
    try:
        client = PolarClient(broker)
        start = time.monotonic()
        batch = client.submit(tasks, group_size=samples, out=root / "batches")
        p = batch.wait(timeout=1800)
        wall = time.monotonic() - start
    finally:
        node.stop()
    if p.done != samples:
        raise SystemExit(f"{slots} slots: {p.line()}")
    states = batch.samples()
    results = batch.results()
    harness = [r["timings"]["run_s"] for r in results]
    stages = {k: statistics.mean(r["timings"].get(k, 0.0) for r in results)
              for k in ("prepare_s", "evaluate_s", "postrun_s")}
    span = [s["t_done"] - s["t_queued"] for s in states.values()]  # queued -> done, each sample
    started = [s["t_done"] - s["t_prepare"] for s in states.values()]  # its stages, without queueing
    return {"slots": slots, "samples": samples, "wall_s": wall, "per_min": samples / wall * 60,
            "harness_s": statistics.mean(harness), "overhead_s": statistics.mean(started) - statistics.mean(harness),
            "queued_to_done_s": statistics.mean(span), **stages}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=6)
    parser.add_argument("--adapter", default="pi")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="polar-bench-rollout-") as d:
        tmp = Path(d)
        model = context_view(ROOT / "fixtures" / "tiny-qwen2", 65536, tmp / "model")
        with redis_server(tmp) as url, reference_server(model, POLICY, log_path=tmp / "serve.log") as engine:
            broker = url.rsplit("/", 1)[0] + "/1"
            rows = [one_setting(slots, args.samples, args.adapter, tmp, broker, engine, model) for slots in (1, 2)]
    print(f"rollout: {args.samples} {args.adapter} samples per setting, one node")
    print(f"{'slots':>5} {'samples/min':>11} {'harness s':>9} {'overhead s':>10} {'prepare':>7} {'evaluate':>8} "
          f"{'postrun':>7} {'queued->done s':>14}")
    for r in rows:
        print(f"{r['slots']:>5} {r['per_min']:>11.2f} {r['harness_s']:>9.2f} {r['overhead_s']:>10.2f} "
              f"{r['prepare_s']:>7.2f} {r['evaluate_s']:>8.2f} {r['postrun_s']:>7.2f} {r['queued_to_done_s']:>14.2f}")
    print(f"2 slots / 1 slot throughput: {rows[1]['per_min'] / rows[0]['per_min']:.2f}x; "
          f"overhead / harness time (1 slot): {rows[0]['overhead_s'] / rows[0]['harness_s']:.2f}")


if __name__ == "__main__":
    main()
