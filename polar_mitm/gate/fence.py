"""The weight-sync fence: while a trainer updates the engine's weights, every proxy holds new LLM calls (the
harness just waits) and reports its in-flight calls, so `pause()` returns once nothing is generating.

State lives in Redis (the proxies' `polar_sessions` URL), so all nodes obey it and a proxy that starts during a
pause starts paused:
  polar:fence               {"paused": bool, "epoch": n}          set by pause()/resume()
  polar:fence:proxy:<id>    {"epoch": n, "paused": bool, "inflight": k}   each proxy, every POLL_S, expires
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import time
import uuid

log = logging.getLogger(__name__)

FENCE_KEY = "polar:fence"
EPOCH_KEY = "polar:fence:epoch"
PROXY_PREFIX = "polar:fence:proxy:"
POLL_S = 0.1
REPORT_TTL_S = 3


def _redis(url: str):
    import redis

    return redis.Redis.from_url(url, socket_timeout=5)


def _set_state(url: str, paused: bool) -> int:
    r = _redis(url)
    epoch = int(r.incr(EPOCH_KEY))
    r.set(FENCE_KEY, json.dumps({"paused": paused, "epoch": epoch}))
    return epoch


def is_paused(redis_url: str) -> bool:
    raw = _redis(redis_url).get(FENCE_KEY)
    return bool(raw and json.loads(raw).get("paused"))


def proxy_reports(redis_url: str) -> dict[str, dict]:
    r = _redis(redis_url)
    keys = list(r.scan_iter(PROXY_PREFIX + "*"))
    values = r.mget(keys) if keys else []
    return {k.decode()[len(PROXY_PREFIX):]: json.loads(v) for k, v in zip(keys, values) if v}


def pause(redis_url: str, timeout_s: float = 120.0) -> None:
    """Hold new LLM calls on every proxy and wait until none has a call in flight; TimeoutError names the
    proxies still busy (the pause stays in force: call resume() to lift it)."""
    epoch = _set_state(redis_url, True)
    deadline = time.monotonic() + timeout_s
    while True:
        busy = {p: r for p, r in proxy_reports(redis_url).items()
                if r.get("epoch", 0) < epoch or r.get("inflight", 0) > 0}
        if not busy:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"fence: proxies still busy after {timeout_s:g} s: {busy}")
        time.sleep(POLL_S / 2)


def resume(redis_url: str) -> None:
    """Let held calls go on."""
    _set_state(redis_url, False)


class Fence:
    """Proxy side: `await hold(flow_id)` before a call is routed; `leave(flow_id)` once it is answered."""

    def __init__(self) -> None:
        self.url: str | None = None
        self.proxy_id = f"{os.uname().nodename}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.paused = False
        self.epoch = 0
        self.inflight: set[str] = set()
        self._resumed = asyncio.Event()
        self._resumed.set()
        self._polled = asyncio.Event()
        self._task: asyncio.Task | None = None

    def configure(self, url: str | None) -> None:
        self.url = url
        if url is None:
            self._polled.set()

    def start(self) -> None:
        if self.url and self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._poll_forever())

    async def hold(self, flow_id: str) -> None:
        await self._polled.wait()  # a proxy started during a pause starts paused
        while self.paused:
            await self._resumed.wait()
        self.inflight.add(flow_id)

    def leave(self, flow_id: str) -> None:
        self.inflight.discard(flow_id)

    async def _poll_forever(self) -> None:
        import redis.asyncio

        client = redis.asyncio.Redis.from_url(self.url, socket_timeout=5)
        while True:
            try:
                await self._poll(client)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # Redis away: keep the last state, say so once per failure
                log.error("polar: fence: %s: %s", type(e).__name__, e)
                self._polled.set()
                await asyncio.sleep(1.0)
            await asyncio.sleep(POLL_S)

    async def _poll(self, client) -> None:
        raw = await client.get(FENCE_KEY)
        state = json.loads(raw) if raw else {"paused": False, "epoch": 0}
        self.paused, self.epoch = bool(state.get("paused")), int(state.get("epoch", 0))
        if self.paused:
            self._resumed.clear()
        else:
            self._resumed.set()
        self._polled.set()
        report = {"epoch": self.epoch, "paused": self.paused, "inflight": len(self.inflight)}
        await client.set(PROXY_PREFIX + self.proxy_id, json.dumps(report), ex=REPORT_TTL_S)
