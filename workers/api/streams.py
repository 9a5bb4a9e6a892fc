"""`GET /events` for any number of clients on two Redis connections per `polar api` process.

One reader task (the Hub) follows the event stream with a blocking XREAD on its own connection and hands each
event to every open stream's queue, with one heartbeat (`Service.pulse`) per interval for all of them. A client
that starts from an earlier position (`Last-Event-ID`, `?after=`) first reads what it missed with XRANGE on a
second, shared connection for short commands; then it takes the Hub's events, skipping those it already sent.
At most `max_streams` streams are open at once (the route answers 429 beyond); a stream's slot and queue are
freed the moment its client goes. A client too slow to keep `QUEUE_SIZE` events in hand is cut off: it reconnects
with its `Last-Event-ID` and catches up from Redis.
"""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable

import redis

from workers import events

QUEUE_SIZE = 2000
PAGE = 500
log = logging.getLogger(__name__)


def _key(event_id: str) -> tuple[int, int]:
    ms, _, seq = event_id.partition("-")
    return int(ms), int(seq or 0)


@dataclass(eq=False)
class Subscriber:
    queue: asyncio.Queue = field(default_factory=lambda: asyncio.Queue(QUEUE_SIZE))


class Hub:
    def __init__(self, reader: Any, commands: Any, pulse: Callable[[], dict[str, Any]], heartbeat_s: float,
                 max_streams: int) -> None:
        self.reader, self.commands = reader, commands  # redis.asyncio clients of one connection each
        self.pulse, self.heartbeat_s, self.max_streams = pulse, heartbeat_s, max_streams
        self.subscribers: set[Subscriber] = set()
        self.position = "0-0"
        self.task: asyncio.Task | None = None

    async def start(self) -> None:
        self.position = await self.last_id()
        self.task = asyncio.create_task(self._run(), name="polar-events-hub")

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)
        for client in (self.reader, self.commands):
            await client.aclose()

    async def last_id(self) -> str:
        newest = await self.commands.xrevrange(events.STREAM, count=1)
        return newest[0][0].decode() if newest else "0-0"

    def open(self) -> Subscriber | None:
        """A slot, or None when `max_streams` are open (no await here: the count cannot race)."""
        if len(self.subscribers) >= self.max_streams:
            return None
        sub = Subscriber()
        self.subscribers.add(sub)
        return sub

    def close(self, sub: Subscriber) -> None:
        self.subscribers.discard(sub)

    def _publish(self, item: Any) -> None:
        for sub in list(self.subscribers):
            try:
                sub.queue.put_nowait(item)
            except asyncio.QueueFull:  # cut off: None ends its stream; it resumes from Redis
                while not sub.queue.empty():
                    sub.queue.get_nowait()
                sub.queue.put_nowait(None)
                self.subscribers.discard(sub)

    async def _run(self) -> None:
        beat = time.monotonic()
        while True:
            try:
                found = await events.read_async(self.reader, self.position, int(min(self.heartbeat_s, 1.0) * 1000))
            except (redis.RedisError, OSError) as e:
                log.warning("polar api: reading events for /events: %s", e)
                await asyncio.sleep(1.0)
                continue
            for ev in found:
                self.position = ev.id
                self._publish(ev)
            if time.monotonic() - beat >= self.heartbeat_s:
                beat = time.monotonic()
                if self.subscribers:
                    try:
                        self._publish(("heartbeat", await asyncio.to_thread(self.pulse)))
                    except (redis.RedisError, OSError) as e:
                        log.warning("polar api: heartbeat: %s", e)

    async def missed(self, after: str) -> AsyncIterator[events.Event]:
        """Events after `after` already in the stream, oldest first, a page at a time."""
        while True:
            page = events.parse(await self.commands.xrange(events.STREAM, min=f"({after}", count=PAGE))
            for ev in page:
                yield ev
            if len(page) < PAGE:
                return
            after = page[-1].id


def frame(kind: str, data: dict[str, Any], event_id: str | None = None) -> bytes:
    import json

    head = f"id: {event_id}\n" if event_id else ""
    return f"{head}event: {kind}\ndata: {json.dumps(data)}\n\n".encode()


async def sse(hub: Hub, sub: Subscriber, after: str, batch: str | None) -> AsyncIterator[bytes]:
    """`hello` first (the position it starts after), then every event after it in stream order, and the Hub's
    heartbeats (fence, nodes). Ends when the client goes (the response is cancelled) or is cut off."""
    def wanted(ev: events.Event) -> bool:
        return batch is None or ev.data.get("batch_id") in (None, batch)

    yield frame("hello", {"after": after})
    sent = _key(after)
    async for ev in hub.missed(after):
        sent = _key(ev.id)
        if wanted(ev):
            yield frame(ev.kind, ev.to_dict(), ev.id)
    while (item := await sub.queue.get()) is not None:
        if isinstance(item, tuple):
            yield frame(*item)
        elif _key(item.id) > sent:
            sent = _key(item.id)
            if wanted(item):
                yield frame(item.kind, item.to_dict(), item.id)
