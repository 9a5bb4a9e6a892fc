"""Node liveness in Redis: plain functions on a redis client, used by the nodes (workers/heartbeat.py), the client
and the CLI alike.

Keys, all under `polar:node:<node>` (and the set `polar:nodes` of every node that ever beat):
  (string, TTL the node's liveness timeout)  its heartbeat: JSON {node, hostname, pid, state, beat_at, started_at,
                   load, in_flight, output_root, proxies (their memory)}; refreshed every heartbeat interval,
                   gone when the node is lost (or left)
  :samples (set)   "<batch_id> <sample_id>" of the samples it holds (prepared there: their stages run there)
  :groups (set)    "<batch_id> <group_id>" of the groups whose advantages it is writing
  :drain           the unix time by which a drained node hands over what is still running
  :left            when it shut down cleanly (`stopped` rather than `lost` in the listing)
A node whose heartbeat is gone is lost: whoever notices first reassigns what it held (workers.steps.reap).
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any, Sequence

import redis

NODES = "polar:nodes"
ALIVE, DRAINING, STOPPED, LOST = "alive", "draining", "stopped", "lost"


def key(node: str, *parts: str) -> str:
    return ":".join(("polar:node:" + node, *parts))


@dataclass(frozen=True)
class NodeStatus:
    node: str
    state: str  # alive | draining | stopped | lost
    beat_at: float | None
    load: int
    in_flight: tuple[str, ...]  # sample ids
    output_root: str | None = None  # where the node writes batch folders (POLAR_OUTPUT_ROOT), while it beats
    proxies: tuple[dict[str, Any], ...] = ()  # its proxies' status files (polar_mitm/status_file.py), as it beat

    def line(self) -> str:
        ago = "-" if self.beat_at is None else f"{time.time() - self.beat_at:.0f}s ago"
        line = f"{self.node}: {self.state}, {self.load} in flight, last heartbeat {ago}"
        return line + (f"; {proxies_line(self.proxies)}" if self.proxies and self.beat_at is not None else "")


def proxies_line(proxies: Sequence[dict[str, Any]]) -> str:
    """The memory a node's proxies hold, summed, and each proxy that stopped reporting (gone or stuck)."""
    up = [p for p in proxies if p.get("state") == "reporting"]
    mb = 2**20
    line = (f"{len(proxies)} {'proxy' if len(proxies) == 1 else 'proxies'}: "
            f"RSS {sum(p['rss_bytes'] for p in up) / mb:.0f} MB, "
            f"{sum(p['histories'] for p in up)} session histories {sum(p['history_bytes'] for p in up) / mb:.1f} MB")
    budgets = [p["history_budget_bytes"] for p in up if p.get("history_budget_bytes")]
    if budgets:
        line += f" (budget {sum(budgets) / mb:.0f} MB)"
    line += f", {sum(p['evicted'] for p in up)} evicted"
    for k, p in enumerate(proxies):
        if p.get("state") != "reporting":
            line += f"; proxy {p.get('index', k)} not reporting ({p.get('state')}" + (
                f", last {p['age_s']:.0f}s ago)" if "age_s" in p else ")")
    return line


def beat(r: redis.Redis, node: str, ttl_s: float, fields: dict[str, Any]) -> bool:
    """Refresh the node's heartbeat; False when it had expired (the node may have been declared lost)."""
    pipe = r.pipeline()
    pipe.exists(key(node))
    pipe.set(key(node), json.dumps({"node": node, "beat_at": time.time(), **fields}), px=int(ttl_s * 1000))
    pipe.sadd(NODES, node)
    pipe.delete(key(node, "left"))
    return bool(pipe.execute()[0])


def leave(r: redis.Redis, node: str) -> None:
    """A clean shutdown: the heartbeat goes at once (what the node held is reassigned without waiting)."""
    pipe = r.pipeline()
    pipe.delete(key(node))
    pipe.set(key(node, "left"), time.time())
    pipe.execute()


def alive(r: redis.Redis, node: str) -> bool:
    return bool(r.exists(key(node)))


def track(r: redis.Redis, node: str, batch_id: str, item: str, kind: str = "samples") -> None:
    r.sadd(key(node, kind), f"{batch_id} {item}")


def untrack(r: redis.Redis, node: str, batch_id: str, item: str, kind: str = "samples") -> bool:
    """Remove an entry; True for the one caller that removed it (a claim)."""
    return bool(r.srem(key(node, kind), f"{batch_id} {item}"))


def held(r: redis.Redis, node: str, kind: str = "samples") -> list[tuple[str, str]]:
    """(batch_id, sample_id or group_id) entries the node holds."""
    return sorted(tuple(m.decode().split(" ", 1)) for m in r.smembers(key(node, kind)))  # type: ignore[misc]


def drain(r: redis.Redis, node: str, deadline_s: float) -> None:
    """Ask a node to take no new samples and hand over, `deadline_s` from now, what it still runs; listed as
    draining at once, not at its next heartbeat."""
    r.set(key(node, "drain"), time.time() + deadline_s)
    _show_state(r, node, DRAINING)


def undrain(r: redis.Redis, node: str) -> None:
    r.delete(key(node, "drain"))
    _show_state(r, node, ALIVE)


def _show_state(r: redis.Redis, node: str, state: str) -> None:
    """Write `state` into the node's live heartbeat (its TTL kept; nothing when it has none)."""
    raw = r.get(key(node))
    if raw:
        r.set(key(node), json.dumps({**json.loads(raw), "state": state}), keepttl=True, xx=True)


def drain_deadline(r: redis.Redis, node: str) -> float | None:
    value = r.get(key(node, "drain"))
    return float(value) if value else None


def silent_nodes(r: redis.Redis) -> list[str]:
    """Registered nodes without a heartbeat (lost, or left)."""
    names = sorted(n.decode() for n in r.smembers(NODES))
    if not names:
        return []
    pipe = r.pipeline()
    for n in names:
        pipe.exists(key(n))
    return [n for n, up in zip(names, pipe.execute()) if not up]


def nodes(r: redis.Redis) -> list[NodeStatus]:
    found = []
    for name in sorted(n.decode() for n in r.smembers(NODES)):
        raw = r.get(key(name))
        if raw:
            beat_ = json.loads(raw)
            state = DRAINING if r.exists(key(name, "drain")) else beat_.get("state", ALIVE)
            found.append(NodeStatus(name, state, beat_.get("beat_at"), int(beat_.get("load", 0)),
                                    tuple(beat_.get("in_flight", ())), beat_.get("output_root"),
                                    tuple(beat_.get("proxies", ()))))
        else:
            held_ = tuple(s for _, s in held(r, name))
            state = STOPPED if r.exists(key(name, "left")) and not held_ else LOST
            found.append(NodeStatus(name, state, None, len(held_), held_))
    return found
