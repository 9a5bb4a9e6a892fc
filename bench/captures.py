"""Capture size per session, format 1 (every line self-contained) vs the linear form (format 2,
docs/captures.md), on synthetic agent sessions of 10, 50 and 100 turns, against the floor: every distinct
thing stored once (the conversation's token ids and output logprobs, the final request's text, which holds
every message, and each reply). Also: writer CPU per call, and read speed of both forms.

Each session: system prompt + tool list (1500 tokens; ~6 KB of text and a 5-tool JSON list in the request),
a task (200 tokens), then per turn 150 sampled tokens and a 400-token tool result; a title side call first.

    .venv/bin/python bench/captures.py [--json]
"""
from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import orjson  # noqa: E402

from polar_traj.captures import CaptureWriter  # noqa: E402
from polar_traj.capture_reader import read_capture  # noqa: E402
from polar_traj.records import CallRecord  # noqa: E402

SYSTEM, TASK, OUTPUT, TOOL, EOT = 1500, 200, 150, 400, 2
TURNS = (10, 50, 100)
TOOLS = [{"type": "function", "function": {
    "name": f"tool_{i}", "description": "Runs a command in the workspace and returns its output. " * 15,
    "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}, "timeout": {"type": "integer"}},
                   "required": ["cmd"]}}} for i in range(5)]


def session(turns: int, rng: np.random.Generator) -> list[CallRecord]:
    def ids(n: int) -> list[int]:
        return rng.integers(3, 150000, n).tolist()

    def text(n_tokens: int) -> str:
        return " ".join(f"w{x}" for x in rng.integers(0, 10**5, n_tokens))

    def logprobs(n: int) -> list[float]:
        return [float(x) for x in np.round(-rng.exponential(0.5, n), 6)]

    records, clock = [], 1000.0

    def call(call_id: str, prompt: list[int], output: list[int], request: dict, reply: str, parent: str | None):
        nonlocal clock
        clock += 2.0
        records.append(CallRecord(
            call_id=call_id, task_id="task", session_id="s", api="openai_chat", model="m", stream=True,
            started_at=clock, ended_at=clock + 1.5, latency_ms=1500.0, policy_version=3,
            prompt_ids=tuple(prompt), output_ids=tuple(output), output_logprobs=tuple(logprobs(len(output))),
            finish_reason="stop", prefix_source="substituted", parent_call_id=parent, request=request,
            response={"id": call_id, "choices": [{"message": {"role": "assistant", "content": reply}}]}))

    call("title", ids(60), ids(10) + [EOT], {"model": "m", "messages": [{"role": "user", "content": text(40)}]},
         text(8), None)
    messages = [{"role": "system", "content": text(SYSTEM - 400)}, {"role": "user", "content": text(TASK)}]
    prompt, parent = ids(SYSTEM) + ids(TASK), None
    for n in range(turns):
        output, reply = ids(OUTPUT - 1) + [EOT], text(OUTPUT // 2)
        call(f"c{n}", prompt, output, {"model": "m", "stream": True, "messages": list(messages), "tools": TOOLS},
             reply, parent)
        messages += [{"role": "assistant", "content": reply}, {"role": "tool", "content": text(TOOL)}]
        prompt, parent = prompt + output + ids(TOOL), f"c{n}"
    return records


def floor_bytes(records: list[CallRecord]) -> dict:
    """Every distinct thing once: all ids of the conversation and the side call, their logprobs, the
    last request (it holds every message), every reply."""
    last = records[-1]
    ids = list(records[0].prompt_ids + records[0].output_ids + last.prompt_ids + last.output_ids)
    logprobs = [x for r in records for x in r.output_logprobs]
    ids_b = len(orjson.dumps(ids))
    return {"distinct_ids": len(ids), "bytes_per_id": ids_b / len(ids),
            "floor": ids_b + len(orjson.dumps(logprobs)) + len(orjson.dumps(last.request))
            + len(orjson.dumps(records[0].request)) + sum(len(orjson.dumps(r.response)) for r in records)}


def _append_v1(root: Path, record: CallRecord) -> None:
    """append_record without its fsync (the linear writer here runs without one too)."""
    path = root / record.task_id / f"{record.session_id}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        f.write(record.to_json() + "\n")


def cpu() -> float:
    u = resource.getrusage(resource.RUSAGE_SELF)
    return u.ru_utime + u.ru_stime


def measure(turns: int, tmp: Path) -> dict:
    records = session(turns, np.random.default_rng(turns))
    row = {"turns": turns, "calls": len(records), **floor_bytes(records)}
    for form in ("format1", "linear"):
        root = tmp / f"{form}-{turns}"
        writer = CaptureWriter(root, fsync=False)
        start = cpu()
        for r in records:
            writer.write(r) if form == "linear" else _append_v1(root, r)
        write_cpu = cpu() - start
        path = root / "task" / "s.jsonl"
        start = cpu()
        got = list(read_capture(path))
        read_cpu = cpu() - start
        if got != records:
            raise AssertionError(f"{form}: read back differs")
        size = path.stat().st_size
        row[form] = {"bytes": size, "x_floor": size / row["floor"],
                     "write_ms_per_call": write_cpu * 1000 / len(records),
                     "read_calls_per_cpu_s": len(records) / read_cpu, "read_mb_per_cpu_s": size / 1e6 / read_cpu}
    return row


def table(rows: list[dict]) -> list[str]:
    out = ["| turns | calls | distinct ids | floor MB | format 1 MB | ×floor | linear MB | ×floor | "
           "write CPU ms/call f1 → linear | read calls/cpu-s f1 → linear |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        f1, f2 = r["format1"], r["linear"]
        out.append(f"| {r['turns']} | {r['calls']} | {r['distinct_ids']} | {r['floor'] / 1e6:.2f} | "
                   f"{f1['bytes'] / 1e6:.2f} | {f1['x_floor']:.1f} | {f2['bytes'] / 1e6:.2f} | {f2['x_floor']:.2f} | "
                   f"{f1['write_ms_per_call']:.2f} → {f2['write_ms_per_call']:.2f} | {f1['read_calls_per_cpu_s']:.0f} → {f2['read_calls_per_cpu_s']:.0f} |")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="polar-captures-bench-") as tmp:
        rows = [measure(t, Path(tmp)) for t in TURNS]
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    print("\n".join(table(rows)))
    print(f"total {time.perf_counter() - started:.1f}s (floor: distinct ids + logprobs + last request + replies, "
          f"once each; writes without fsync; reads: read_capture, CPU seconds of this process)")


if __name__ == "__main__":
    main()
