"""The HTTP API's overhead: the same zero-work batch (Pi answers in plain text after one LLM call, the
evaluator is `true`) submitted through the Redis client and then through `polar api` with
`PolarClient("http://…")`, on one node; submit-to-last-result time of each (trajectories in hand), and their
ratio, from one run. Real Redis, reference server, worker node (2 run slots) and uvicorn, loopback only.

    .venv/bin/python bench/api.py [--samples 40]

A warm-up batch of 2 samples runs first, so neither path pays the node's first sandbox and harness start. The
issue asks for 200 samples; on this 2-core machine that is about 12 minutes per path, past `make bench`'s
limit of 900 s per bench, so the default is 40 (`--samples 200` by hand). Measured once with 200: Redis
717.8 s, HTTP 758.5 s submit to trajectories in hand, ratio 1.057 (on a machine shared with other work: most of
the gap is the samples' own time, which the two paths share; the API adds a request per submit and per poll).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
import yaml  # noqa: E402

from polar import PolarClient  # noqa: E402
from polar.run.services import context_view  # noqa: E402
from polar_mitm.launch import free_port  # noqa: E402
from polar_serve.launch import reference_server  # noqa: E402
from tests.redis_server import redis_server  # noqa: E402
from tests.workers.cluster import node_env, start_node  # noqa: E402

POLICY = ROOT / "fixtures" / "policies" / "plain-answer.yaml"
TOKEN = "bench-token-" + "x" * 16


def timed(client, tasks: Path, samples: int, out: Path) -> dict:
    start = time.monotonic()
    batch = client.submit(tasks, group_size=samples, out=out)
    submitted = time.monotonic() - start
    p = batch.wait(timeout=3600, poll_s=0.2)
    finished = time.monotonic() - start
    rows = len(batch.trajectories())
    return {"submit_s": submitted, "finished_s": finished, "total_s": time.monotonic() - start, "rows": rows,
            "done": p.done, "masked": p.masked}


def start_api(root: Path, broker: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "polar.cli", "api", "--port", str(port), "--broker", broker,
                             "--out", str(root / "batches"), "--tasks-root", str(root)], cwd=ROOT,
                            env={**os.environ, "POLAR_API_TOKEN": TOKEN}, stdout=open(root / "api.log", "wb"),
                            stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.2)
    proc.kill()
    raise SystemExit(f"polar api did not start: {(root / 'api.log').read_text()[-2000:]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=40)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="polar-bench-api-") as d:
        root = Path(d)
        model = context_view(ROOT / "fixtures" / "tiny-qwen2", 65536, root / "model")
        tasks = root / "tasks.yaml"
        tasks.write_text(yaml.safe_dump({"tasks": [{"task_id": "zero", "instruction": "Say something.",
                                                    "adapter": "pi", "image": "host", "timeout_s": 240,
                                                    "evaluator": {"command": "true", "timeout_s": 30},
                                                    "submit": []}]}))
        with redis_server(root) as url, reference_server(model, POLICY, log_path=root / "serve.log") as engine:
            broker = url.rsplit("/", 1)[0] + "/1"
            node = start_node(node_env(broker, url.rsplit("/", 1)[0] + "/0", engine, model, root, "bench"),
                              concurrency=2)
            proc, api_url = start_api(root, broker)
            try:
                PolarClient(broker).submit(tasks, group_size=2, out=root / "batches").wait(timeout=600)
                rows = {"redis": timed(PolarClient(broker), tasks, args.samples, root / "batches"),
                        "http": timed(PolarClient(api_url, token=TOKEN), tasks, args.samples, root / "batches")}
            finally:
                proc.terminate()
                node.stop()
    print(f"api: one zero-work batch of {args.samples} Pi samples per path, one node with 2 run slots")
    print(f"{'path':>6} {'submit s':>9} {'last result s':>13} {'+ trajectories s':>16} {'rows':>5} {'masked':>6}")
    for name, r in rows.items():
        print(f"{name:>6} {r['submit_s']:>9.2f} {r['finished_s']:>13.2f} {r['total_s']:>16.2f} {r['rows']:>5} "
              f"{r['masked']:>6}")
    print(f"http / redis, submit to trajectories in hand: {rows['http']['total_s'] / rows['redis']['total_s']:.3f}")


if __name__ == "__main__":
    main()
