"""`polar submit | status | batches | cancel | policy | node | nodes`: batches on the rollout workers (`celery -A workers worker`)."""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, TextIO

from polar.argtypes import positive_seconds
from polar_mitm.sessions.sampling import add_sampling_args, sampling_from_args
from workers.settings import DEFAULT_BROKER, sessions_url


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("submit", help="submit a batch of tasks to the rollout workers", description=__doc__)
    p.add_argument("tasks", type=Path, help="tasks file (YAML or JSONL), or a Harbor task directory or a folder "
                                            "of them")
    p.add_argument("--group-size", type=int, default=4, help="samples per task (a GRPO group)")
    p.add_argument("--min-groups", type=int, help="finish once this many groups are complete; cancel the rest")
    p.add_argument("--adapter", help="harness adapter for every task (default: each task's own)")
    p.add_argument("--tasks-root", type=Path, help="where the tasks' workspaces, tests and Harbor folders may lie "
                                                   "(default: POLAR_TASKS_ROOT, else the task file's folder and the "
                                                   "current directory; docs/tasks.md)")
    p.add_argument("--out", type=Path,
                   help="output root on storage every node sees (the batch gets OUT/<batch_id>); default: the "
                        "POLAR_OUTPUT_ROOT the live nodes announce, else $POLAR_OUTPUT_ROOT or runs/batches")
    p.add_argument("--run-offline", action="store_true",
                   help="tasks that ask for the internet run their verifiers offline too (otherwise each node's "
                        "egress proxy, POLAR_VERIFIER_HOSTS; agents never get it)")
    p.add_argument("--max-staleness", type=int, help="mark trajectories whose calls span more weight versions")
    p.add_argument("--strategy", choices=["prefix_merge", "per_request"], default="prefix_merge",
                   help="trajectories per sample: one row per append-only chain (prefix_merge) or per LLM call")
    p.add_argument("--wait", action="store_true", help="show progress until the batch finishes, then a summary")
    p.add_argument("--timeout", type=positive_seconds, help="with --wait: give up after this many seconds")
    p.add_argument("--max-masked", type=int, default=0,
                   help="with --wait: exit 1 when more samples than this were masked (default: any)")
    add_sampling_args(p)
    _broker(p)
    p.set_defaults(func=submit)
    s = sub.add_parser("status", help="progress of a batch, and the nodes (alive, draining, stopped, lost)")
    s.add_argument("batch", nargs="?", help="batch id (none: only the nodes)")
    s.add_argument("--json", action="store_true", help="machine-readable")
    _broker(s)
    s.set_defaults(func=_checked(status))
    b = sub.add_parser("batches", help="the batches this broker keeps, newest first, with their progress")
    b.add_argument("--limit", type=int, default=20, help="show at most this many (0: all)")
    b.add_argument("--json", action="store_true", help="machine-readable")
    _broker(b)
    b.set_defaults(func=_checked(list_batches))
    ns = sub.add_parser("nodes", help="the rollout nodes: alive, draining, stopped or lost, with their load")
    _broker(ns)
    ns.set_defaults(func=_checked(node), action="list", node=None)
    c = sub.add_parser("cancel", help="cancel a batch: queued samples never start, running ones stop")
    c.add_argument("batch", help="batch id")
    _broker(c)
    c.set_defaults(func=_checked(cancel))
    f = sub.add_parser("policy", help="weight-sync fence: hold (pause) or release (resume) every node's LLM calls")
    f.add_argument("action", choices=["pause", "resume", "status"])
    f.add_argument("--timeout", type=positive_seconds, default=120.0, help="pause: seconds to wait for in-flight calls")
    _broker(f)
    f.set_defaults(func=_checked(policy))
    n = sub.add_parser("node", help="rollout nodes: list them, or drain one (no new samples; the rest handed over)")
    n.add_argument("action", choices=["list", "drain", "undrain"])
    n.add_argument("node", nargs="?", help="drain/undrain: the node's name (POLAR_NODE)")
    n.add_argument("--deadline", type=positive_seconds, default=300.0,
                   help="drain: seconds its running samples may take to finish before they are handed over")
    _broker(n)
    n.set_defaults(func=_checked(node))


def _broker(p: argparse.ArgumentParser) -> None:
    p.add_argument("--broker", default=os.environ.get("POLAR_BROKER", DEFAULT_BROKER), help="Celery broker (Redis)")
    p.add_argument("--sessions", default=os.environ.get("POLAR_SESSIONS"),
                   help="sessions/fence Redis (default: the broker's server, db 0)")


def _client(args: argparse.Namespace):
    from workers.client import RedisTransport

    return RedisTransport(args.broker, args.sessions)


def unreachable(args: argparse.Namespace, command: str) -> str | None:
    """One line when the Redis this command needs does not answer, checked with one quick ping: the client's
    own calls ride out a Redis restart for a minute, then end in a traceback."""
    import redis

    from workers.batches import connect

    try:
        url, names = (args.sessions or sessions_url(args.broker), "--sessions/POLAR_SESSIONS") \
            if command.startswith("policy") else (args.broker, "--broker/POLAR_BROKER")
        connect(url, retry_s=2).ping()
    except ValueError as e:
        return f"polar {command}: {e}"
    except redis.RedisError as e:
        return f"polar {command}: cannot reach Redis at {url} ({names}): {' '.join(str(e).split())[:200]}"
    return None


def _checked(command):
    """The command, after its Redis answered (else one line, exit 2)."""
    def run(args: argparse.Namespace) -> int:
        name = args.command + (f" {args.action}" if args.command in ("policy", "node") else "")
        if (problem := unreachable(args, name)) is not None:
            print(problem, file=sys.stderr)
            return 2
        return command(args)
    return run


def submit(args: argparse.Namespace) -> int:
    from polar.tasks.load import load_tasks

    try:  # the user's own inputs first, then the connection
        if not 1 <= args.group_size <= 999:
            raise ValueError(f"--group-size {args.group_size}: expected 1-999")
        load_tasks(args.tasks, args.tasks_root)  # a malformed task file is said before any connection
        sampling = sampling_from_args(args)
    except (ValueError, OSError) as e:
        print(f"polar submit: {e}", file=sys.stderr)
        return 2
    if (problem := unreachable(args, "submit")) is not None:
        print(problem, file=sys.stderr)
        return 2
    try:
        client = _client(args)
        nodes = client.nodes()
        out, where = output_root(args.out, nodes)
        batch = client.submit(args.tasks, args.group_size, args.min_groups, args.adapter, out,
                              args.max_staleness, sampling=sampling, strategy=args.strategy,
                              tasks_root=args.tasks_root, run_offline=args.run_offline)
    except (ValueError, OSError, KeyError) as e:
        print(f"polar submit: {e}", file=sys.stderr)
        return 2
    print(f"batch {batch.batch_id}: {len(batch.manifest.samples)} samples in {len(batch.manifest.groups)} groups, "
          f"folder {batch.dir} ({where})")
    if (idle := no_live_node(nodes, args.broker)) is not None:
        print(f"polar submit: {idle}", file=sys.stderr)
    if not args.wait:
        return 0
    try:
        p = follow(batch, args.timeout)
    except TimeoutError as e:
        print(f"polar submit: {e}", file=sys.stderr)
        return 124
    print(summary(batch, p))
    if (problem := wait_verdict(batch, p, args.max_masked)) is not None:
        print(f"polar submit: {problem}", file=sys.stderr)
        return 1
    return 0 if p.status == "completed" else 1


def no_live_node(nodes: list, broker: str) -> str | None:
    """The line a batch submitted with no worker node alive gets (None when one is): it stays queued until one
    starts, and --wait would wait out its timeout in silence."""
    if any(n.state in ("alive", "draining") for n in nodes):
        return None
    lost = sorted(n.node for n in nodes if n.state == "lost")
    return ("no worker node is alive on this broker" + (f" (lost: {', '.join(lost)})" if lost else "") +
            f": the batch stays queued until one starts: `POLAR_BROKER={broker} celery -A workers worker` on a node "
            "(`polar nodes` lists them)")


def output_root(given: Path | None, nodes: list) -> tuple[Path, str]:
    """Where a batch's folder goes, and why there: --out; else the output root the live nodes announce (they
    write the results; the client's own ./runs/batches is another folder on another machine); else
    $POLAR_OUTPUT_ROOT or runs/batches. ValueError when live nodes disagree."""
    if given is not None:
        return given, "--out"
    roots = sorted({n.output_root for n in nodes if n.output_root and n.state in ("alive", "draining")})
    if len(roots) > 1:
        raise ValueError(f"the live nodes write to different output roots ({', '.join(roots)}): give --out")
    if roots:
        return Path(roots[0]), "the nodes' POLAR_OUTPUT_ROOT"
    env = os.environ.get("POLAR_OUTPUT_ROOT")
    return Path(env or "runs/batches"), ("$POLAR_OUTPUT_ROOT" if env else "no live node announced its output "
                                         "root: the default runs/batches; give --out the nodes' POLAR_OUTPUT_ROOT")


def wait_verdict(batch, p, max_masked: int = 0) -> str | None:
    """Why a finished batch is not a success: cancelled, or more samples masked than allowed, with the most
    common reasons and their counts; None when it is one."""
    from collections import Counter

    if p.status == "cancelled":
        return f"batch {batch.batch_id} was cancelled ({p.cancelled} samples did not finish)"
    if p.masked <= max_masked:
        return None
    reasons = Counter(" ".join(str(r.get("reason")).split())[:160] for r in batch.results()
                      if r.get("status") == "error" or r.get("failure") == "infrastructure")
    top = "; ".join(f"{n}x {reason}" for reason, n in reasons.most_common(3))
    return f"{p.masked} of {p.total} samples masked (allowed {max_masked}): {top or 'reasons not recorded'}"


def follow(batch, timeout: float | None, stream: TextIO | None = None):
    """A live progress bar until the batch settles; into a log or a pipe (not a terminal), one line each time the
    counts change instead of a bar's redraws (a `make demo` log was 65 KB of them)."""
    stream = stream or sys.stderr
    if not stream.isatty():
        return batch.wait(timeout, on_progress=progress_lines(stream))
    from tqdm import tqdm

    with tqdm(total=len(batch.manifest.samples), unit="sample", dynamic_ncols=True, file=stream) as bar:
        def draw(p) -> None:
            bar.n = p.done + p.masked + p.cancelled
            bar.set_postfix_str(f"running {p.running} failed {p.masked} reward "
                                f"{'-' if p.reward_mean is None else f'{p.reward_mean:.3f}'}")
            bar.refresh()

        return batch.wait(timeout, on_progress=draw)


def progress_lines(stream: TextIO) -> Callable[[Any], None]:
    """An on_progress that prints the batch's progress line when it differs from the last one printed."""
    last: list[str] = []

    def show(p) -> None:
        line = p.line()
        if last != [line]:
            last[:] = [line]
            print(f"progress: {line}", file=stream, flush=True)

    return show


def summary(batch, p) -> str:
    lines = [f"batch {batch.batch_id}: {p.line()}"]
    if p.nodes:
        lines.append("  samples per node: " + ", ".join(f"{n} {c}" for n, c in sorted(p.nodes.items())))
    for sid, st in sorted(batch.samples().items()):
        if st.get("reassigned"):
            lines.append(f"  reassigned {sid}: from {', '.join(st.get('reassigned_from') or [])} "
                         f"to {st.get('node')} ({st.get('stage')})")
    df = batch.trajectories()
    lines.append(f"  trajectories: {len(df)} rows in {batch.dir / 'trajectories'}")
    results = batch.results()
    rewards: dict[str, list[float]] = {}
    for res in results:
        if res.get("reward") is not None:
            rewards.setdefault(res.get("task_id") or "?", []).append(float(res["reward"]))
    if rewards:  # as make demo prints it
        lines.append("  reward mean per task: " + ", ".join(f"{task} {sum(r) / len(r):.2f} (n={len(r)})"
                                                           for task, r in sorted(rewards.items())))
    for res in results:
        if res.get("status") == "error" or res.get("failure") == "infrastructure":
            lines.append(f"  masked {res['sample_id']}: {res.get('failure')}: {res.get('reason')}")
    return "\n".join(lines)


def _find_batch(args: argparse.Namespace, command: str):
    """The batch named on the command line, or None after one error line naming the command."""
    try:
        return _client(args).batch(args.batch)
    except (KeyError, ValueError, OSError) as e:
        print(f"polar {command}: {e}", file=sys.stderr)
        return None


def status(args: argparse.Namespace) -> int:
    client = _client(args)
    nodes = client.nodes()
    if args.batch is None:
        if args.json:
            print(json.dumps([asdict(n) for n in nodes]))
        else:
            print("\n".join(n.line() for n in nodes) or "no nodes have ever beat on this broker")
            print(_fence_line(client))
        return 0
    if (batch := _find_batch(args, "status")) is None:
        return 2
    p = batch.progress()
    if args.json:
        print(json.dumps({"batch_id": batch.batch_id, "dir": str(batch.dir), **p.to_dict(),
                          "node_states": {n.node: n.state for n in nodes}}))
    else:
        print(summary(batch, p))
        print("  nodes: " + (", ".join(f"{n.node} {n.state}" for n in nodes) or "none"))
        print(f"  {_fence_line(client)}")
    return 0


def _fence_line(client) -> str:
    """Whether the weight-sync fence holds every proxy's new LLM calls (a forgotten pause stalls every batch)."""
    import redis

    try:
        paused = client.is_paused()
    except (redis.RedisError, ValueError, OSError) as e:
        return f"fence: unknown ({client.sessions}: {' '.join(str(e).split())[:120]})"
    return "fence: PAUSED: proxies hold new LLM calls (polar policy resume)" if paused else "fence: running"


def node(args: argparse.Namespace) -> int:
    client = _client(args)
    if args.action == "list":
        print("\n".join(n.line() for n in client.nodes()) or "no nodes have ever beat on this broker")
        return 0
    if not args.node:
        print(f"polar node {args.action}: name the node", file=sys.stderr)
        return 2
    if args.node not in {n.node for n in client.nodes()}:
        print(f"polar node {args.action}: no node {args.node!r} has ever beat on this broker", file=sys.stderr)
        return 2
    if args.action == "drain":
        client.drain(args.node, args.deadline)
        print(f"node {args.node}: draining; samples still running in {args.deadline:g}s are handed over")
    else:
        client.undrain(args.node)
        print(f"node {args.node}: takes new samples again")
    return 0


def list_batches(args: argparse.Namespace) -> int:
    from workers import batches

    client = _client(args)
    ids = batches.batch_ids(client.redis)
    shown = ids[:args.limit] if args.limit > 0 else ids
    rows, lines = [], []
    for batch_id in shown:
        try:
            batch = client.batch(batch_id)
        except (KeyError, ValueError, OSError) as e:  # its folder is gone (or not mounted here)
            rows.append({"batch_id": batch_id, "error": str(e)})
            lines.append(f"{batch_id}: unreadable: {e}")
            continue
        created, p = batch.manifest.created, batch.progress()
        rows.append({"batch_id": batch_id, "created": created, "dir": str(batch.dir), **p.to_dict()})
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(created)) if created else "?"
        lines.append(f"{batch_id}  {when}  {p.line()}  {batch.dir}")
    if args.json:
        print(json.dumps(rows))
        return 0
    print("\n".join(lines) or "no batches on this broker")
    if len(ids) > len(shown):
        print(f"... and {len(ids) - len(shown)} older (--limit 0 shows all)")
    return 0


def cancel(args: argparse.Namespace) -> int:
    if (batch := _find_batch(args, "cancel")) is None:
        return 2
    if not batch.cancel():
        print(f"polar cancel: batch {batch.batch_id} had already finished ({batch.progress().status})")
        return 1
    print(f"batch {batch.batch_id}: cancelled; running samples are stopping")
    return 0


def policy(args: argparse.Namespace) -> int:
    client = _client(args)
    try:
        if args.action == "pause":
            client.pause(args.timeout)
            print("policy: paused (proxies hold new LLM calls; in-flight calls drained)")
        elif args.action == "resume":
            client.resume()
            print("policy: resumed")
        else:
            print("policy: paused" if client.is_paused() else "policy: running")
    except (TimeoutError, ValueError, OSError, ImportError) as e:
        print(f"polar policy {args.action}: {e}", file=sys.stderr)
        return 2
    return 0
