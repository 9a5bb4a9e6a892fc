"""`make demo`: Polar's main job on embedded defaults. A scored batch goes through the Celery rollout service:
the three demo tasks (fixtures/tasks: small Python repos with a failing test) x a group of 4 samples x two
harnesses (Pi and Codex CLI, unchanged), each sample in its own sandbox (runtime `auto`: Apptainer for a task
with an image), against the reference server (tiny model) with a stochastic policy that fixes the bug about half
of the time, so rewards differ inside a group. The evaluator (the repo's tests) gives each sample its reward.

It starts a private Redis (broker, sessions), the reference server and one worker node (`celery -A workers
worker` with its proxy), submits the batch, shows the live progress bar, prints the batch summary, writes
runs/demo-<time>/ (batch.json, samples/, trajectories/ with rewards and advantages, report.html) and stops
everything it started.

    .venv/bin/python scripts/demo.py [--harness pi --harness codex] [--group-size 4] [--task fix-calc …]
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from contextlib import ExitStack
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
MODEL = ROOT / "fixtures" / "tiny-qwen2"
POLICY = ROOT / "fixtures" / "policies" / "fix-bug-sometimes.yaml"
TASKS = ROOT / "fixtures" / "tasks" / "tasks.yaml"
TOOL_PATHS = (ROOT / ".tools" / "npm" / "node_modules" / ".bin", ROOT / ".tools" / "apptainer" / "usr" / "bin")


class DemoError(RuntimeError):
    pass


def tasks_file(out: Path, harnesses: list[str], only: list[str] | None) -> Path:
    """The demo tasks once per harness (task id `<task>-<harness>`: a GRPO group shares one harness's prompt),
    relative paths made absolute, written beside the batch's services."""
    import yaml

    raw = yaml.safe_load(TASKS.read_text())["tasks"]
    known = [t["task_id"] for t in raw]
    unknown = sorted(set(only or ()) - set(known))
    if unknown:
        raise DemoError(f"--task: unknown task {', '.join(unknown)} (known: {', '.join(known)})")
    entries = []
    for harness in harnesses:
        for t in raw:
            if only and t["task_id"] not in only:
                continue
            entry = {**t, "task_id": f"{t['task_id']}-{harness}", "adapter": harness,
                     "metadata": {**(t.get("metadata") or {}), "task": t["task_id"]}}
            for key in ("workspace", "image", "tests"):
                if entry.get(key) and entry[key] != "host":
                    entry[key] = str((TASKS.parent / entry[key]).resolve())
            entries.append(entry)
    path = out / "tasks.yaml"
    path.write_text(yaml.safe_dump({"tasks": entries}, sort_keys=False))
    return path


def node_env(out: Path, broker: str, sessions: str, engine: str, model: Path, runtime: str) -> dict[str, str]:
    path = os.pathsep.join([str(p) for p in TOOL_PATHS] + [os.environ.get("PATH", "/usr/bin:/bin")])
    return {**os.environ, "PATH": path, "POLAR_BROKER": broker, "POLAR_SESSIONS": sessions,
            "POLAR_ENGINE_URL": engine, "POLAR_MODEL_DIR": str(model), "POLAR_RUNTIME": runtime,
            "POLAR_OUTPUT_ROOT": str(out / "services"), "POLAR_NODE": "demo",
            "POLAR_CONFDIR": str(out / "services" / "ca"),
            "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def summary_lines(batch_dir: Path, wall_s: float) -> list[str]:
    """Samples by status, reward mean per task and harness, calls, trainer tokens per build, wall time."""
    from polar.report.data import load

    d = load(batch_dir)
    s, t = d.samples, d.trajectories
    status = ", ".join(f"{k} {v}" for k, v in s["status"].value_counts().items()) if len(s) else "none"
    lines = [f"samples: {len(s)} ({status}); trajectories {len(t)} in {batch_dir / 'trajectories'}"]
    failures = s[s["status"] != "completed"] if len(s) else s
    for r in failures.itertuples():
        lines.append(f"  {r.sample_id}: {r.status}, {r.failure}: {r.reason}")
    for key in ("task_id", "harness"):
        scored = s[s["reward"].notna()] if len(s) else s
        means = scored.groupby(key)["reward"].agg(["mean", "size"])
        lines.append(f"reward mean per {key.replace('_id', '')}: " + ", ".join(
            f"{k} {row['mean']:.2f} (n={int(row['size'])})" for k, row in means.iterrows()))
    calls = d.calls
    per_request = int(calls.loc[calls["error"].isna(), ["prompt_tokens", "output_tokens"]].sum().sum())
    merged = int((t["prompt_len"] + t["response_len"]).sum()) if len(t) else 0
    ratio = f"{per_request / merged:.2f}x" if merged else "n/a"
    lines.append(f"calls: {len(calls)} ({int(calls['error'].notna().sum())} with an error), "
                 f"{int(calls['latency_ms'].median()) if len(calls) else 0} ms median latency")
    lines.append(f"trainer tokens: per_request {per_request:,}, prefix_merge {merged:,} ({ratio} fewer); "
                 f"sampled {int(t['sampled_tokens'].sum()) if len(t) else 0:,}")
    lines.append(f"wall time: {wall_s:.0f} s")
    return lines


def run_batch(args: argparse.Namespace, out: Path) -> Path:
    from polar import PolarClient
    from polar.run.local_redis import private_redis
    from polar.run.services import context_view, reference_server, worker_node
    from workers.cli import follow

    t0 = time.monotonic()
    with ExitStack() as stack:
        print("== starting: private Redis, reference server (tiny model, fix-bug-sometimes), one worker node")
        redis_url = stack.enter_context(private_redis(out / "services", tcp=True)).rsplit("/", 1)[0]
        broker, sessions = f"{redis_url}/1", f"{redis_url}/0"
        model = context_view(MODEL, 65536, out / "services" / "model")  # harness prompts are long
        engine = stack.enter_context(reference_server(model, args.policy, out / "services" / "serve.log"))
        stack.enter_context(worker_node(node_env(out, broker, sessions, engine, model, args.runtime),
                                        out / "services" / "worker.log", args.concurrency, ROOT))
        client = PolarClient(broker, sessions)
        tasks = tasks_file(out / "services", args.harness, args.task)
        batch = client.submit(tasks, group_size=args.group_size, out=out.parent, batch_id=out.name)
        print(f"== batch {batch.batch_id}: {len(batch.manifest.samples)} samples ({len(batch.manifest.groups)} "
              f"groups of {args.group_size}; harnesses {', '.join(args.harness)}; runtime {args.runtime})")
        progress = follow(batch, args.timeout)
        print(f"== {progress.line()}")
    wall = time.monotonic() - t0
    print("\n== batch summary")
    for line in summary_lines(out, wall):
        print(f"  {line}")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--harness", action="append", help="adapter (repeat; default: pi and codex)")
    ap.add_argument("--task", action="append", help="demo task id (repeat; default: all three)")
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--runtime", default="auto", help="sandbox runtime of the samples (default: auto)")
    ap.add_argument("--concurrency", type=int, default=2, help="samples the node runs at once")
    ap.add_argument("--policy", type=Path, default=POLICY, help="scripted policy of the reference server")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds before the demo gives up on the batch")
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / f"demo-{time.strftime('%Y%m%d-%H%M%S')}")
    args = ap.parse_args(argv)
    args.harness = args.harness or ["pi", "codex"]
    out = args.out.resolve()
    if out.exists() and any(out.iterdir()):
        print(f"demo: {out} exists and is not empty", file=sys.stderr)
        return 2
    (out / "services").mkdir(parents=True, exist_ok=True)
    try:
        run_batch(args, out)
    except (DemoError, TimeoutError, ValueError, OSError, RuntimeError) as e:
        print(f"demo: {e}\n  logs: {out / 'services'}", file=sys.stderr)
        return 1
    from polar.report.cli import write_report

    page = write_report(out, out / "report.html")
    print(f"\n== report: {page} (open it in a browser; `polar report {out}` redraws it)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
