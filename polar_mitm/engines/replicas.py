"""Many inference engines: session-affine placement across replicas, health probes and failover.

A session's next prompt extends its previous one, so keeping the session on one replica turns its history into a
prefix-cache hit there. Each new session goes to the least-loaded replica that is up (fewest calls in flight from
this proxy, then fewest sessions placed) and stays there. A replica that stops answering (connection refused, the
engine timeout, failed health probes while none of its calls was answered for SERVING_S) is marked down; its
sessions move on their next call when another replica is up (when none is, they stay: a move would only break their
chains), and a replica that answers its probe (or a call) again takes new sessions. A replica that has never
answered is not marked down by its probes during a start-up grace period (the proxy may start a moment before its
engines). With sessions in Redis the placement is shared, so every proxy sends a session to the same replica
(`polar:engine:<task_id>/<session_id>`).
"""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Callable, Protocol

import aiohttp

from polar_mitm.conversation import ProviderError
from polar_mitm.engines.backends import placement_key
from polar_mitm.engines.client import EngineClient, Timeouts

log = logging.getLogger(__name__)
PROBE_TIMEOUT_S = 5.0
PROBE_MISSES = 2  # a probe that times out or answers non-200 this many times in a row marks the replica down
START_GRACE_S = 30.0  # probes of a replica that never answered do not mark it down this long after the start
SERVING_S = 10.0  # a replica that answered a call this recently is up whatever its health probe answers


@dataclass
class Replica:
    url: str
    client: EngineClient
    up: bool = True
    why_down: str = ""
    inflight: int = 0  # calls of this proxy being generated there now
    placed: int = 0  # sessions placed there by this proxy
    served: int = 0  # calls answered there
    misses: int = 0  # consecutive failed probes
    seen: bool = False  # it answered a probe or a call at least once
    answered_at: float = float("-inf")  # time.monotonic() of its last answered call
    waiting: str = ""  # why its probes fail while it is still counted as up (the start-up grace)

    @property
    def state(self) -> str:
        if not self.up:
            return f"down ({self.why_down})"
        return f"not answering yet ({self.waiting})" if self.waiting else "up"


class EnginePool:
    def __init__(self, urls: tuple[str, ...], timeouts: Timeouts, placement: str = "least_loaded",
                 grace_s: float = START_GRACE_S) -> None:
        self.replicas = [Replica(url, EngineClient(url, timeouts)) for url in urls]
        self.placement = placement
        self.grace_until = time.monotonic() + grace_s
        self._turn = 0

    def get(self, url: str | None) -> Replica | None:
        return next((r for r in self.replicas if r.url == url), None)

    def choose(self, exclude: frozenset[str] = frozenset()) -> Replica:
        """The replica for a new (or moving) session. When none is known to be up, one not yet tried is used
        anyway (a probe may be stale), so a single engine behaves as before; ProviderError when none is left."""
        candidates = [r for r in self.replicas if r.up and r.url not in exclude]
        if not candidates:
            candidates = [r for r in self.replicas if r.url not in exclude]
        if not candidates:
            tried = "; ".join(f"{r.url} ({r.why_down or 'failed'})" for r in self.replicas)
            raise ProviderError(503, f"polar: no inference engine answered: {tried}", "overloaded_error")
        if self.placement == "round_robin":
            self._turn += 1
            return candidates[self._turn % len(candidates)]
        return min(candidates, key=lambda r: (r.inflight, r.placed))

    def mark_down(self, replica: Replica, why: str) -> None:
        if replica.up:
            then = "; its sessions move to another engine" if len(self.replicas) > 1 else ""
            log.warning("polar: engine %s is down (%s)%s", replica.url, why, then)
        replica.up, replica.why_down = False, why

    def mark_up(self, replica: Replica) -> None:
        if not replica.up:
            log.warning("polar: engine %s is up again; it takes new sessions", replica.url)
        replica.up, replica.why_down, replica.misses, replica.seen, replica.waiting = True, "", 0, True, ""

    def answered(self, replica: Replica) -> None:
        """A call was served there: it is up, whatever its last probe said."""
        replica.served += 1
        replica.answered_at, replica.misses = time.monotonic(), 0
        if not replica.up or not replica.seen:
            self.mark_up(replica)

    def unreachable(self) -> str | None:
        """Why no engine can answer (each replica and its probe's complaint) when none has ever answered and every
        one is down or failing its probes; None otherwise."""
        if any(r.seen for r in self.replicas) or not all(not r.up or r.waiting for r in self.replicas):
            return None
        return "; ".join(f"{r.url} ({r.why_down or r.waiting})" for r in self.replicas)

    def any_up(self, exclude: frozenset[str] = frozenset()) -> bool:
        return any(r.up and r.url not in exclude for r in self.replicas)

    def _probe_failed(self, replica: Replica, why: str, at_once: bool) -> None:
        if not replica.seen and time.monotonic() < self.grace_until:
            replica.waiting = why  # still starting, perhaps: a call that fails there marks it down (fail_over)
            return
        if not at_once and time.monotonic() - replica.answered_at < SERVING_S:
            return  # its calls are answered (a health check that says 503 while weights load, say): the calls win
        replica.misses += 1
        if at_once or replica.misses >= PROBE_MISSES:
            self.mark_down(replica, why)

    async def probe(self, replica: Replica) -> None:
        """GET /health (SGLang, vLLM and polar serve all answer it)."""
        try:
            session = replica.client.http()
            timeout = aiohttp.ClientTimeout(total=PROBE_TIMEOUT_S)
            async with session.get(replica.url + "/health", timeout=timeout) as r:
                ok, why = r.status == 200, f"health probe answered {r.status}"
        except aiohttp.ClientConnectionError as e:
            if not isinstance(e, aiohttp.ServerTimeoutError):
                self._probe_failed(replica, f"health probe: {type(e).__name__}", at_once=True)
                return
            ok, why = False, "health probe timed out"
        except asyncio.TimeoutError:
            ok, why = False, "health probe timed out"
        if ok:
            self.mark_up(replica)
            return
        self._probe_failed(replica, why, at_once=False)

    async def probe_all(self) -> None:
        await asyncio.gather(*(self.probe(r) for r in self.replicas))

    def status(self, sessions: dict[str, int]) -> str:
        parts = []
        for r in self.replicas:
            parts.append(f"{r.url} {r.state} inflight={r.inflight} sessions={sessions.get(r.url, 0)} calls={r.served}")
        return "; ".join(parts)

    async def close(self) -> None:
        for r in self.replicas:
            await r.client.close()


class SharedPlacement:
    """Placements in Redis, so that every proxy sends a session to the same replica; they expire with the
    session's idle TTL. Redis trouble degrades to this proxy's own placement, never to an error."""

    def __init__(self, url: str, ttl_s: int) -> None:
        import redis.asyncio

        self.client = redis.asyncio.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)
        self.ttl_s = ttl_s

    async def get(self, key: str) -> str | None:
        try:
            raw = await self.client.get(key)
        except Exception as e:  # redis errors, OSError, timeouts
            log.error("polar: engine placement: Redis: %s: %s", type(e).__name__, e)
            return None
        return raw.decode() if raw else None

    async def claim(self, key: str, url: str) -> str:
        """`url` when this proxy placed the session first, else the replica another proxy put it on."""
        try:
            if await self.client.set(key, url, nx=True, ex=self.ttl_s):
                return url
            raw = await self.client.get(key)
        except Exception as e:
            log.error("polar: engine placement: Redis: %s: %s", type(e).__name__, e)
            return url
        return raw.decode() if raw else url

    async def move(self, key: str, url: str) -> None:
        try:
            await self.client.set(key, url, ex=self.ttl_s)
        except Exception as e:
            log.error("polar: engine placement: Redis: %s: %s", type(e).__name__, e)

    async def close(self) -> None:
        await self.client.aclose()


class Placed(Protocol):
    """The per-session state that remembers its replica (polar_mitm.tokens.prompt.SessionHistory)."""

    engine: str | None

    def move_to(self, url: str) -> None: ...


class Engines:
    """What the router uses: the pool, the shared placement, and the probe and status tasks."""

    def __init__(self) -> None:
        self.pool = EnginePool(("http://127.0.0.1:30000",), Timeouts())
        self.shared: SharedPlacement | None = None
        self._tasks: list[asyncio.Task] = []

    def configure(self, urls: tuple[str, ...], timeouts: Timeouts, placement: str,
                  grace_s: float = START_GRACE_S) -> None:
        old, self.pool = self.pool, EnginePool(urls, timeouts, placement, grace_s)
        if any(r.client.opened for r in old.replicas):  # a reconfigure while running: free the old pool
            closing = asyncio.get_running_loop().create_task(old.close())
            self._tasks.append(closing)  # held until stop(): the loop keeps tasks only weakly

    async def start(self, redis_url: str | None, ttl_s: int, probe_s: float, status_s: float,
                    sessions: Callable[[], dict[str, int]], memory: Callable[[], str] | None = None) -> None:
        await self.pool.probe_all()
        log.info("polar: engines (%s placement): %s", self.pool.placement, self.pool.status({}))
        if redis_url:
            self.shared = SharedPlacement(redis_url, ttl_s)
        loop = asyncio.get_running_loop()
        self._tasks.append(loop.create_task(self._probe_forever(probe_s)))
        if status_s > 0:
            self._tasks.append(loop.create_task(self._report_forever(status_s, sessions, memory)))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await self.pool.close()
        if self.shared is not None:
            await self.shared.close()

    async def _probe_forever(self, interval_s: float) -> None:
        while True:
            await asyncio.sleep(interval_s)
            try:
                await self.pool.probe_all()
            except Exception:  # a probe bug must not end the probing
                log.exception("polar: engine health probe failed")

    async def _report_forever(self, interval_s: float, sessions: Callable[[], dict[str, int]],
                              memory: Callable[[], str] | None) -> None:
        while True:
            await asyncio.sleep(interval_s)
            log.info("polar: engines: %s", self.pool.status(sessions()))
            if memory is not None:
                log.info("polar: memory: %s", memory())

    async def place(self, key: tuple[str, str], state: Placed, tried: frozenset[str] = frozenset()) -> Replica:
        """The replica for the session's next call: where it was placed (by this proxy or, through Redis, any
        other), else a new choice. A session whose replica is down (or in `tried`) moves when another replica
        is up: `move_to` restarts its history, so the next prompt is rendered in full and labelled
        `rendered:engine_moved`. When no other replica is known to be up, a session stays where it is (its
        replica failing this very call, `tried`, is the one reason to move anyway)."""
        pool = self.pool
        shared_key = placement_key(*key)
        if state.engine is None and self.shared is not None:
            state.engine = await self.shared.get(shared_key)
            if state.engine is not None and pool.get(state.engine) is None:
                state.engine = None  # placed by a proxy that knows other engines
        current = pool.get(state.engine)
        if current is not None and current.url not in tried and (current.up or not pool.any_up(tried)):
            return current
        chosen = pool.choose(tried)
        if chosen is current:  # nothing else to go to (e.g. a single engine, marked down): stay, keep the chain
            return chosen
        if state.engine is None:
            url = await self.shared.claim(shared_key, chosen.url) if self.shared else chosen.url
            first = pool.get(url)  # another proxy placed it first
            if first is not None and first.up and first.url not in tried:
                chosen = first
            elif url != chosen.url:
                await self.shared.move(shared_key, chosen.url)
            state.engine = chosen.url
        else:
            log.info("polar: session %s/%s moves from %s to %s", *key, state.engine, chosen.url)
            state.move_to(chosen.url)
            if self.shared is not None:
                await self.shared.move(shared_key, chosen.url)
        chosen.placed += 1
        return chosen
