"""The service's event stream: one Redis stream (`polar:events`, in the broker's db) that the workers append to
as samples change stage, groups finish and batches end, and that `polar api` reads for `GET /events` (SSE) and
its callbacks. Appending never fails a stage: a Redis error is logged and the event dropped (the state itself is
in the batch's hashes, which stay the truth).

Each entry: `kind` (sample | group | batch | fence) and `data` (JSON): sample {batch_id, sample_id, stage, prev,
node, reward, status}; group {batch_id, group_id, groups_done}; batch {batch_id, status}; fence {paused}.
"""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

import redis

STREAM = "polar:events"
MAXLEN = 100_000  # trimmed approximately: about a day of a busy service, a bounded memory cost
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Event:
    id: str  # the stream entry id ("<ms>-<seq>"): ordered, and the SSE id a client resumes from
    kind: str
    data: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "kind": self.kind, **self.data}


def emit(r: redis.Redis, kind: str, **data: Any) -> None:
    try:
        r.xadd(STREAM, {"kind": kind, "data": json.dumps(data)}, maxlen=MAXLEN, approximate=True)
    except redis.RedisError as e:
        log.warning("polar: event %s %s not recorded: %s", kind, data, e)


def parse(entries: list) -> list[Event]:
    """XREAD / XREADGROUP / XRANGE entries as Events."""
    out = []
    for entry_id, fields in entries:
        out.append(Event(entry_id.decode() if isinstance(entry_id, bytes) else entry_id,
                         fields[b"kind"].decode(), json.loads(fields[b"data"])))
    return out


def last_id(r: redis.Redis) -> str:
    """The newest entry's id ("0-0" for an empty stream): read after it to see only what comes next."""
    newest = r.xrevrange(STREAM, count=1)
    return newest[0][0].decode() if newest else "0-0"


def read(r: redis.Redis, after: str, block_ms: int = 1000, count: int = 500) -> list[Event]:
    """Events after `after`, waiting up to `block_ms` for the first."""
    found = r.xread({STREAM: after}, count=count, block=block_ms)
    return parse(found[0][1]) if found else []


async def read_async(r, after: str, block_ms: int = 1000, count: int = 500) -> list[Event]:
    """`read` on a redis.asyncio client: a waiting reader holds no thread (one per SSE client otherwise)."""
    found = await r.xread({STREAM: after}, count=count, block=block_ms)
    return parse(found[0][1]) if found else []


def async_client(sync: redis.Redis, single: bool = False):
    """A redis.asyncio client to the same server and db as `sync` (TCP or unix socket); `single`: one connection
    for all its commands (made on first use, taken in turn), never a pool that grows with its callers."""
    import redis.asyncio

    kw = sync.connection_pool.connection_kwargs
    common = {k: kw[k] for k in ("db", "username", "password") if kw.get(k) is not None}
    if kw.get("path"):
        return redis.asyncio.Redis(unix_socket_path=kw["path"], single_connection_client=single, **common)
    return redis.asyncio.Redis(host=kw.get("host", "127.0.0.1"), port=kw.get("port", 6379),
                               single_connection_client=single, **common)


def history(r: redis.Redis, after: str = "-", count: int = 10_000) -> list[Event]:
    """Events still in the stream after `after` (inclusive for "-"), oldest first."""
    start = after if after == "-" else f"({after}"
    return parse(r.xrange(STREAM, min=start, count=count))
