"""The stream relay: an HTTP server inside the proxy process, on 127.0.0.1, that mitmproxy connects to for
each streamed call (the only upstream connection mitmproxy may open). The transport of a streamed call and no
more: it holds the calls routed to it until mitmproxy connects, checks the relay's secret, and hands the
connection to the call's owner (calls/owner.py), which opens the engine stream, so it can answer in the
provider's own shape when the engine is down or too slow, end a stream that breaks off with the provider's
error event, and tell a client that went away from an engine that failed. Only provider-like headers go back."""
from __future__ import annotations

import logging
import secrets
import time
from typing import Protocol

from aiohttp import web
from mitmproxy import http

from polar_mitm.calls.call import Call

log = logging.getLogger(__name__)
SECRET_HEADER = "x-polar-relay"
SSE_HEADERS = {"content-type": "text/event-stream", "cache-control": "no-cache"}
KEEP_HEADERS = ("content-type", "cache-control", "transfer-encoding", "content-length")
# mitmproxy connects to the relay within milliseconds of routing a call; a call still waiting this long has
# lost its client in a way no hook reported, and must not keep its body in memory.
PENDING_TTL_S = 60.0


class Streams(Protocol):
    """The owner of the streamed calls (calls/owner.py)."""

    async def stream(self, call: Call, request: web.Request) -> web.StreamResponse: ...

    async def lost(self, call: Call, why: str) -> None: ...


class StreamRelay:
    def __init__(self, owner: Streams) -> None:
        self.owner = owner
        self.secret = secrets.token_urlsafe(24)
        self.pending: dict[str, tuple[Call, float]] = {}  # call id -> (call, routed at, monotonic), oldest first
        self.address: tuple[str, int] | None = None
        self._runner: web.AppRunner | None = None

    async def start(self) -> tuple[str, int]:
        app = web.Application()
        app.router.add_post("/polar/stream/{call_id}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.address = site._server.sockets[0].getsockname()[:2]
        return self.address

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def route(self, flow: http.HTTPFlow, call: Call) -> None:
        """Point the flow at the relay; nothing of the harness's request goes with it."""
        host, port = self.address
        await self._expire(time.monotonic())
        self.pending[call.call_id] = (call, time.monotonic())
        flow.request.scheme, flow.request.host, flow.request.port = "http", host, port
        flow.request.method, flow.request.path = "POST", f"/polar/stream/{call.call_id}"
        flow.request.headers.clear()
        flow.request.headers["host"] = f"{host}:{port}"
        flow.request.headers[SECRET_HEADER] = self.secret
        flow.request.content = b""
        flow.metadata["polar_relay"] = True

    def routed(self, flow: http.HTTPFlow) -> bool:
        """The flow goes to this relay, and nowhere else."""
        return (bool(flow.metadata.get("polar_relay")) and self.address is not None
                and (flow.request.host, flow.request.port) == tuple(self.address))

    def drop(self, call_id: str) -> None:
        """The call's flow ended (its client left, or mitmproxy gave up) before the relay picked it up."""
        self.pending.pop(call_id, None)

    async def _expire(self, now: float) -> None:
        while self.pending:
            call_id, (call, routed_at) = next(iter(self.pending.items()))
            if routed_at > now - PENDING_TTL_S:
                return
            del self.pending[call_id]
            log.warning("polar: call %s: the stream relay never received it; dropped", call_id)
            await self.owner.lost(call, "the stream relay never received the call")

    def pass_through(self, flow: http.HTTPFlow) -> None:
        """Stream the relay's answer as it comes, with only the headers a provider would send."""
        for name in list(flow.response.headers.keys()):
            if name.lower() not in KEEP_HEADERS:
                del flow.response.headers[name]
        flow.response.stream = True

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        if not secrets.compare_digest(request.headers.get(SECRET_HEADER, ""), self.secret):
            return web.Response(status=404)  # before anything is popped: a guess cannot drop another's call
        call, _ = self.pending.pop(request.match_info["call_id"], (None, 0.0))
        if call is None:
            return web.Response(status=404)
        return await self.owner.stream(call, request)
