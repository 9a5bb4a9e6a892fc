"""`GET /metrics` in Prometheus' text format, computed per scrape from Redis: samples by state and stage
durations over the batches the broker keeps (newest `limit`), queue depths, nodes, the fence, and the counters
the finisher keeps (LLM calls, tokens, callbacks; counted as samples finish while a `polar api` runs)."""
from __future__ import annotations

from typing import Any

import redis

from workers import batches, liveness
from workers.api.callbacks import COUNTERS

STAGE_ORDER = ("queued", "prepare", "run", "postrun")
ENDS = ("done", "masked", "cancelled")


def _line(name: str, value: float, **labels: str) -> str:
    inner = ",".join(f'{k}="{v}"' for k, v in labels.items())
    return f"{name}{{{inner}}} {value}" if inner else f"{name} {value}"


def stage_durations(states: list[dict[str, Any]]) -> dict[str, list[float]]:
    """Seconds each sample spent in each stage it left (from the `t_<stage>` entry times)."""
    spent: dict[str, list[float]] = {s: [] for s in STAGE_ORDER}
    for st in states:
        marks = sorted((t, k[2:]) for k, t in st.items() if k.startswith("t_") and isinstance(t, (int, float)))
        for (t0, stage), (t1, _) in zip(marks, marks[1:]):
            if stage in spent:
                spent[stage].append(t1 - t0)
    return spent


def render(r: redis.Redis, paused: bool, limit: int = 200, streams: int = 0) -> str:
    out = ["# HELP polar_samples Samples of the kept batches by state.", "# TYPE polar_samples gauge"]
    by_state = {s: 0 for s in (*STAGE_ORDER, "evaluate", "retry", *ENDS)}
    by_status = {batches.RUNNING: 0, batches.COMPLETED: 0, batches.CANCELLED: 0}
    states: list[dict[str, Any]] = []
    for b in batches.batch_ids(r)[:limit]:
        status = batches.status(r, b)
        by_status[status] = by_status.get(status, 0) + 1
        for st in batches.samples(r, b).values():
            by_state[st.get("stage", "queued")] = by_state.get(st.get("stage", "queued"), 0) + 1
            states.append(st)
    out += [_line("polar_samples", n, state=s) for s, n in by_state.items()]
    out += ["# HELP polar_batches Kept batches by status.", "# TYPE polar_batches gauge"]
    out += [_line("polar_batches", n, status=s) for s, n in by_status.items()]
    out += ["# HELP polar_stage_seconds Time samples spent in each stage.", "# TYPE polar_stage_seconds summary"]
    for stage, spent in stage_durations(states).items():
        out += [_line("polar_stage_seconds_sum", round(sum(spent), 6), stage=stage),
                _line("polar_stage_seconds_count", len(spent), stage=stage)]
    nodes = liveness.nodes(r)
    queues = ["prepare", "postrun", *(f"{n.node}.{q}" for n in nodes for q in ("run", "postrun"))]
    out += ["# HELP polar_queue_depth Messages waiting in each Celery queue.", "# TYPE polar_queue_depth gauge"]
    out += [_line("polar_queue_depth", int(r.llen(q)), queue=q) for q in queues]
    out += ["# HELP polar_node_load Samples each node holds.", "# TYPE polar_node_load gauge"]
    out += [_line("polar_node_load", n.load, node=n.node, state=n.state) for n in nodes]
    out += ["# HELP polar_fence_paused 1 while the weight-sync fence holds new LLM calls.",
            "# TYPE polar_fence_paused gauge", _line("polar_fence_paused", int(paused))]
    out += ["# HELP polar_event_streams Open /events streams of this API process.",
            "# TYPE polar_event_streams gauge", _line("polar_event_streams", streams)]
    counters = {k.decode(): int(v) for k, v in r.hgetall(COUNTERS).items()}
    for name, key, help_ in (("polar_llm_calls_total", "calls", "LLM calls of finished samples."),
                             ("polar_samples_finished_total", "samples_finished", "Samples finished."),
                             ("polar_callbacks_delivered_total", "callbacks_delivered", "Callbacks delivered."),
                             ("polar_callbacks_failed_total", "callbacks_failed", "Callbacks given up on.")):
        out += [f"# HELP {name} {help_}", f"# TYPE {name} counter", _line(name, counters.get(key, 0))]
    out += ["# HELP polar_tokens_total Trajectory tokens of finished samples.", "# TYPE polar_tokens_total counter",
            _line("polar_tokens_total", counters.get("prompt_tokens", 0), side="prompt"),
            _line("polar_tokens_total", counters.get("response_tokens", 0), side="response")]
    return "\n".join(out) + "\n"
