"""The stream relay: an HTTP server inside the proxy process, on 127.0.0.1, that mitmproxy connects to for
each streamed call (the only upstream connection mitmproxy may open). It opens the engine stream itself, so
it can answer in the provider's own shape when the engine is down or too slow, end a stream that breaks off
with the provider's error event, tell a client that went away from an engine that failed, and send only
provider-like headers."""
from __future__ import annotations

import asyncio
import logging
import secrets
import time

import aiohttp
from aiohttp import web
from mitmproxy import http

from polar_mitm.calls.call import Call
from polar_mitm.calls.dispatch import Dispatcher
from polar_mitm.calls.streaming import StreamTranslator
from polar_mitm.capture import CaptureError
from polar_mitm.conversation import ProviderError
from polar_mitm.engines.client import EngineFailure, chunks, engine_json, engine_refused
from polar_mitm.engines.replicas import Replica

log = logging.getLogger(__name__)
SECRET_HEADER = "x-polar-relay"
SSE_HEADERS = {"content-type": "text/event-stream", "cache-control": "no-cache"}
KEEP_HEADERS = ("content-type", "cache-control", "transfer-encoding", "content-length")
# mitmproxy connects to the relay within milliseconds of routing a call; a call still waiting this long has
# lost its client in a way no hook reported, and must not keep its body in memory.
PENDING_TTL_S = 60.0


class StreamRelay:
    def __init__(self, dispatch: Dispatcher) -> None:
        self.dispatch = dispatch
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

    def route(self, flow: http.HTTPFlow, call: Call) -> None:
        """Point the flow at the relay; nothing of the harness's request goes with it."""
        host, port = self.address
        self._expire(time.monotonic())
        self.pending[call.call_id] = (call, time.monotonic())
        flow.request.scheme, flow.request.host, flow.request.port = "http", host, port
        flow.request.method, flow.request.path = "POST", f"/polar/stream/{call.call_id}"
        flow.request.headers.clear()
        flow.request.headers["host"] = f"{host}:{port}"
        flow.request.headers[SECRET_HEADER] = self.secret
        flow.request.content = b""
        flow.metadata["polar_relay"] = True

    def drop(self, call_id: str) -> None:
        """The call's flow ended (its client left, or mitmproxy gave up) before the relay picked it up."""
        self.pending.pop(call_id, None)

    def _expire(self, now: float) -> None:
        while self.pending:
            call_id, (call, routed_at) = next(iter(self.pending.items()))
            if routed_at > now - PENDING_TTL_S:
                return
            del self.pending[call_id]
            log.warning("polar: call %s: the stream relay never received it; dropped", call_id)
            call.flags.append("truncated")
            try:
                self.dispatch.finish(call, None, None, "the stream relay never received the call")
            except CaptureError:
                pass  # logged by Capture

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
        try:
            return await self._serve(call, request)
        except Exception as e:  # a bug here must still end in the provider's error and a record
            log.exception("polar: call %s: stream relay failed", call.call_id)
            return await self._error(call, ProviderError(500, f"polar: internal error ({type(e).__name__})", "api_error"))

    async def _error(self, call: Call, e: ProviderError) -> web.Response:
        answer = await self.dispatch.fail_async(call, e)  # records the call unless it already was
        return web.Response(status=answer.status_code, body=answer.content, content_type="application/json")

    async def _serve(self, call: Call, request: web.Request) -> web.StreamResponse:
        try:  # nothing has reached the harness before the engine answers: a failed replica is retried on another
            replica, upstream = await self.dispatch.on_replica(
                call, lambda replica: replica.client.open_stream(*call.engine_request))
        except ProviderError as e:
            return await self._error(call, e)
        replica.inflight += 1
        try:
            async with upstream:
                if upstream.status != 200:
                    replica.served += 1
                    return await self._error(call, engine_refused(upstream.status, engine_json(await upstream.read())))
                self.dispatch.engines.pool.answered(replica)
                response = await self._relay(call, replica, upstream, request)
        finally:
            replica.inflight -= 1
        return response

    async def _relay(self, call: Call, replica: Replica, upstream: aiohttp.ClientResponse,
                     request: web.Request) -> web.StreamResponse:
        dispatch = self.dispatch
        translator = StreamTranslator(dispatch.options.engine, call, dispatch.model, dispatch.settle)
        response = web.StreamResponse(status=200, headers=SSE_HEADERS)
        await response.prepare(request)
        try:
            await response.write(translator.start())
            try:
                async for chunk in chunks(upstream, replica.client.timeouts):
                    out = translator.feed(chunk)
                    if out:
                        await response.write(out)
            except ProviderError as e:  # the engine stalled or broke off: the stream had started, no retry
                translator.error = e.message.removeprefix("polar: ")
                if isinstance(e, EngineFailure):
                    dispatch.engines.pool.mark_down(replica, translator.error)
            except (ConnectionResetError, asyncio.CancelledError):
                raise
            except Exception as e:  # a translation bug: end the stream with the error, record it
                log.exception("polar: call %s: translating the stream failed", call.call_id)
                translator.error = f"internal error in the stream translator ({type(e).__name__})"
            await response.write(await translator.end())
            await response.write_eof()
        except ConnectionResetError:
            self._client_gone(call)
        except asyncio.CancelledError:
            self._client_gone(call)
            raise
        return response

    def _client_gone(self, call: Call) -> None:
        if call.recorded:
            return
        call.flags.append("truncated")
        try:
            self.dispatch.finish(call, None, None, "client disconnected")
        except CaptureError:
            pass  # logged by Capture; nobody is listening any more
