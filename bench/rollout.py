"""Rollout service throughput on this machine: samples per minute through real `celery -A workers worker`
nodes with 1 and then 2 run slots (worker concurrency), and per-sample overhead (queueing + prepare + evaluate
+ postrun + hand-offs between stages) beside the harness's own time. Real Redis, the reference server with the
tests' scripted coin policy, Pi in bubblewrap. Then the service's own cost per sample: a zero-work batch (a
harness that makes one curl call, an evaluator `true`, bubblewrap, 2 nodes x 2 run slots, a zero-compute stub
engine), host CPU-s per sample in all (every process on the machine, /proc/stat) and per stage (each stage's
process and the sandboxes it waited for), and by process kind.

    .venv/bin/python bench/rollout.py [--samples 6] [--adapter pi] [--zero-work 1000 | --zero-work-only 1000]
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

from bench.peers import in_namespace, service, stub_command  # noqa: E402
from polar import PolarClient  # noqa: E402
from polar.run.services import context_view  # noqa: E402
from polar_mitm.launch import free_port  # noqa: E402
from polar_serve.launch import reference_server  # noqa: E402
from tests.redis_server import redis_server  # noqa: E402
from tests.workers.cluster import node_env, start_node  # noqa: E402

POLICY = ROOT / "tests" / "workers" / "rollout_policy.yaml"
STAGES = ("prepare", "run", "evaluate", "postrun")
TICK_S = 1 / os.sysconf("SC_CLK_TCK")
# The zero-work harness: one Chat Completions call with curl, through the proxy, and nothing else.
ONE_CALL = {
    "name": "one-call", "description": "one Chat Completions call with curl", "api": "openai_chat", "model": "tiny",
    "provider": {"url": "https://api.openai.com/v1", "base_path": "/v1"},
    "ways_in": {"https_proxy": {"env": {"CURL_CA_BUNDLE": "{{ ca_bundle }}"}}, "base_url": {}},
    "command": ["sh", "-c", 'curl -sS --fail-with-body -o answer.json "{{ base_url }}/chat/completions" '
                '-H "Authorization: Bearer {{ api_key }}" -H "Content-Type: application/json" '
                '-d \'{"model": "{{ model }}", "messages": [{"role": "user", "content": "{{ instruction }}"}]}\'']}


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


def machine_busy_s() -> float:
    """CPU seconds every process on the machine has used since boot (/proc/stat: all but idle and iowait)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) * TICK_S


def cpu_by_pid() -> dict[int, tuple[str, float]]:
    """pid -> (kind, CPU seconds of the process with the children it reaped: utime+stime+cutime+cstime), for the
    service's processes."""
    found: dict[int, tuple[str, float]] = {}
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        kind = ("proxy" if "mitmdump" in cmd or "polar.cli proxy" in cmd else "worker node" if "celery" in cmd
                else "redis" if "redis-server" in cmd else "engine" if "stub_engine" in cmd else None)
        if kind:
            found[int(pid)] = (kind, sum(int(v) for v in stat[11:15]) * TICK_S)
    return found


def cpu_by_kind(before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]]) -> dict[str, float]:
    """CPU seconds per kind between two snapshots (a process gone by the second is counted in its reaper's)."""
    kinds: dict[str, float] = {}
    for pid, (kind, cpu) in after.items():
        then = before.get(pid)
        kinds[kind] = kinds.get(kind, 0.0) + max(0.0, cpu - (then[1] if then and then[0] == kind else 0.0))
    return kinds


def zero_tasks(path: Path, adapter: Path, tasks: int) -> Path:
    path.write_text(yaml.safe_dump({"tasks": [{
        "task_id": f"zero-{k}", "instruction": "Say something.", "adapter": str(adapter), "image": "host",
        "evaluator": {"command": "true", "timeout_s": 30}, "timeout_s": 120, "submit": []} for k in range(tasks)]}))
    return path


def zero_batch(client: PolarClient, root: Path, adapter: Path, samples: int) -> dict:
    """`samples` zero-work samples as groups of at most 100 (a group holds up to 999)."""
    tasks = -(-samples // 100)
    if samples % tasks:
        raise SystemExit(f"--zero-work {samples}: give a multiple of {tasks}")
    tasks_file = zero_tasks(root / f"tasks-{samples}.yaml", adapter, tasks)
    pids, busy, start = cpu_by_pid(), machine_busy_s(), time.monotonic()
    batch = client.submit(tasks_file, group_size=samples // tasks, out=root / "batches")
    p = batch.wait(timeout=3600, poll_s=0.5)
    wall, busy = time.monotonic() - start, machine_busy_s() - busy
    kinds = cpu_by_kind(pids, cpu_by_pid())
    results = batch.results()
    if p.done != samples or len(results) != samples or any(r.get("status") != "completed" for r in results):
        bad = [r.get("reason") for r in results if r.get("status") != "completed"][:3]
        raise SystemExit(f"zero-work batch: {p.line()}; {len(results)} results; not completed: {bad}")
    per_stage = {k: {"cpu_s": statistics.mean(r["timings"].get(f"{k}_cpu_s", 0.0) for r in results),
                     "wall_s": statistics.mean(r["timings"].get(f"{k}_s", 0.0) for r in results)} for k in STAGES}
    return {"samples": samples, "wall_s": wall, "per_min": samples / wall * 60, "cpu_s_per_sample": busy / samples,
            "stages": per_stage, "calls": sum(r.get("calls", 0) for r in results),
            "kinds": {k: v / samples for k, v in sorted(kinds.items())}}


def zero_work(samples: int, tmp: Path) -> dict:
    """The zero-work batch on 2 nodes x 2 run slots, after a warm-up batch of 4 (first sandbox, imports)."""
    root = tmp / "zero-work"
    root.mkdir()
    adapter = root / "one-call.yaml"
    adapter.write_text(yaml.safe_dump(ONE_CALL))
    model = ROOT / "fixtures" / "tiny-qwen2"
    port = free_port()
    with redis_server(root) as url, service(stub_command(port), port, root / "stub.log"):
        broker, engine = url.rsplit("/", 1)[0] + "/1", f"http://127.0.0.1:{port}"
        nodes = [start_node(node_env(broker, url.rsplit("/", 1)[0] + "/0", engine, model, root, f"zero{k}",
                                     POLAR_STATUS_S="0"), concurrency=2) for k in (1, 2)]
        try:
            client = PolarClient(broker)
            zero_batch(client, root, adapter, 4)
            return zero_batch(client, root, adapter, samples)
        finally:
            for node in nodes:
                node.stop()


def print_zero_work(z: dict) -> None:
    print(f"zero-work batch: {z['samples']} samples of one curl call each, evaluator `true`, bwrap, "
          f"2 nodes x 2 run slots, stub engine")
    print(f"  {z['wall_s']:.0f} s, {z['per_min']:.0f} samples/min, {z['calls']} calls; host CPU "
          f"{z['cpu_s_per_sample']:.3f} s per sample (every process on the machine)")
    print(f"  {'stage':>9} {'CPU s':>7} {'wall s':>7}   (per sample: the stage's process and what it waited for)")
    for k, v in z["stages"].items():
        print(f"  {k:>9} {v['cpu_s']:>7.3f} {v['wall_s']:>7.3f}")
    staged = sum(v["cpu_s"] for v in z["stages"].values())
    print(f"  {'in stages':>9} {staged:>7.3f}; the rest ({z['cpu_s_per_sample'] - staged:.3f}) is the sandboxes' "
          f"processes, Celery, Redis, the proxies and the engine between stages")
    other = z["cpu_s_per_sample"] - sum(z["kinds"].values())
    print("  by process kind, CPU s per sample: " + ", ".join(f"{k} {v:.3f}" for k, v in z["kinds"].items())
          + f", other {other:.3f} (the sandboxes' processes, which init reaps: bwrap, the harness, the evaluator; "
          "the kernel's threads)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=6)
    parser.add_argument("--adapter", default="pi")
    parser.add_argument("--zero-work", type=int, default=1000, metavar="N",
                        help="samples in the zero-work batch (0: none)")
    parser.add_argument("--zero-work-only", type=int, metavar="N", help="only the zero-work batch, of N samples")
    args = parser.parse_args()
    in_namespace()
    if args.zero_work_only:
        with tempfile.TemporaryDirectory(prefix="polar-bench-rollout-") as d:
            return print_zero_work(zero_work(args.zero_work_only, Path(d)))
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
          f"overhead / harness time (1 slot): {rows[0]['overhead_s'] / rows[0]['harness_s']:.2f}", flush=True)
    if args.zero_work:
        with tempfile.TemporaryDirectory(prefix="polar-bench-rollout-") as d:
            print_zero_work(zero_work(args.zero_work, Path(d)))


if __name__ == "__main__":
    main()
