"""Polar's hooks, run in order inside one mitmproxy addon, with every flow sealed.

mitmproxy, when an addon hook raises, logs the error and carries on with the flow as it is, and skips the
script's remaining addons: an untouched request would then go upstream (through HTTPS_PROXY, to the real
provider). So the stages run here, in the order they are written, each failure is caught, and a flow leaves
`request` only answered locally or pointed at Polar's own stream relay; anything else is answered with the
provider's 500 and recorded (docs/design.md §2). The connection-layer allowlist in polar_mitm/gate/egress.py
backs this up. A request passes the guard and the session check here; from there its call has one owner
(polar_mitm/calls/owner.py) until its record is written.
"""
from __future__ import annotations

import asyncio
import gc
import logging

from mitmproxy import connection, ctx, http

from polar_mitm.calls.dispatch import Dispatcher
from polar_mitm.calls.owner import CallOwner
from polar_mitm.capture import Capture
from polar_mitm.engines.replicas import Engines
from polar_mitm.gate.auth import SessionAuth
from polar_mitm.gate.egress import Egress, _Refused
from polar_mitm.gate.fence import Fence
from polar_mitm.gate.guard import Guard, api_of
from polar_mitm.gate.quotas import SessionQuotas
from polar_mitm.providers.responses import error_response
from polar_mitm.sessions.histories import Histories
from polar_mitm.sessions.registry import redis_url_of, watch_ended
from polar_mitm.status_file import StatusFile

log = logging.getLogger(__name__)


class Polar:
    """The stages, each declaring its own options, and the hooks that run them in order."""

    def __init__(self) -> None:
        self.capture, self.fence = Capture(), Fence()
        self.egress, self.guard, self.auth, self.quotas = Egress(), Guard(), SessionAuth(), SessionQuotas()
        self.engines, self.histories = Engines(), Histories()
        self.dispatch = Dispatcher(self.engines, self.histories)
        self.calls = CallOwner(self.capture, self.quotas, self.fence, self.dispatch)
        self.status = StatusFile(self.dispatch.memory_figures)
        self.stages = (self.egress, self.guard, self.auth, self.quotas, self.engines, self.histories, self.dispatch,
                       self.capture, self.status)
        self._ended_watch: asyncio.Task[None] | None = None

    # -- lifecycle: errors here must stop the proxy, so they are not caught ---------------------------------
    def load(self, loader) -> None:
        for stage in self.stages:
            if hasattr(stage, "load"):
                stage.load(loader)

    def configure(self, updated) -> None:
        for stage in self.stages:
            stage.configure(updated)
        if "polar_sessions" in updated:
            self.fence.configure(redis_url_of(ctx.options.polar_sessions))

    async def running(self) -> None:
        self.egress.check(ctx.options)
        self.dispatch.check()
        await self.calls.relay.start()
        redis_url = redis_url_of(ctx.options.polar_sessions)
        if redis_url:
            # held: the loop keeps tasks only weakly; a collected one is gone, and the error it logs during start-up
            # makes mitmdump exit
            self._ended_watch = watch_ended(redis_url, self._session_ended)
        await self.engines.start(redis_url, self.histories.ttl_s, self.dispatch.sessions_per_engine,
                                 self.dispatch.memory_line)
        self.status.running()
        self.egress.allowed = {self.calls.relay.address}
        self.fence.start()
        # what start-up made (mitmproxy, transformers, the tokenizer, the template: ~150k objects) lives as long
        # as the proxy: out of the collector's reach, a full collection scans only what calls made since. Left
        # in, each one paused a call ~90 ms about every 250 calls (bench/sessions.py, one call at a time).
        gc.freeze()

    def _session_ended(self, task_id: str, session_id: str) -> None:
        self.histories.drop((task_id, session_id))
        self.capture.forget(task_id, session_id)

    async def done(self) -> None:
        if self._ended_watch is not None:
            self._ended_watch.cancel()
        self.status.done()
        await self.calls.relay.stop()
        await self.engines.stop()
        self.dispatch.close()
        self.capture.done()  # the records still queued are written

    # -- connection layer -----------------------------------------------------------------------------------
    def next_layer(self, nextlayer) -> None:
        try:
            self.egress.next_layer(nextlayer)
        except Exception:
            log.exception("polar: next_layer check failed; closing the connection")
            nextlayer.layer = _Refused(nextlayer.context)

    def server_connect(self, data) -> None:
        self.egress.server_connect(data)  # fails closed by itself

    def client_disconnected(self, client: connection.Client) -> None:
        self.auth.client_disconnected(client)

    # -- flows ----------------------------------------------------------------------------------------------
    async def http_connect(self, flow: http.HTTPFlow) -> None:
        try:
            self.guard.http_connect(flow)
            await self.auth.http_connect(flow)
        except Exception:
            log.exception("polar: http_connect failed")
        if flow.response is None and not flow.metadata.get("polar_connect_ok"):
            flow.response = http.Response.make(502, b"polar: proxy error, CONNECT refused\n", {"content-type": "text/plain"})

    async def request(self, flow: http.HTTPFlow) -> None:
        """guard → auth, then the call's owner: quotas → parse → fence → place → build → engine → reply → record."""
        try:
            self.guard.request(flow)
            await self.auth.request(flow)
            await self.calls.serve(flow)
        except Exception as e:
            log.exception("polar: request failed on %s; the flow is answered here and goes nowhere", flow.request.path)
            await self.calls.refuse(flow, f"internal error ({type(e).__name__})")
            return
        if flow.response is None and not self.calls.relay.routed(flow):
            await self.calls.refuse(flow, "the request was neither answered nor routed to the engine")

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        if not flow.metadata.get("polar_relay"):
            return
        try:
            self.calls.relay.pass_through(flow)
        except Exception:
            log.exception("polar: responseheaders failed on %s", flow.request.path)
            flow.metadata["polar_failed"] = True
            flow.response.stream = False

    def response(self, flow: http.HTTPFlow) -> None:
        self.calls.release(flow)
        if flow.metadata.get("polar_failed"):
            flow.response = error_response(api_of(flow), 500, "polar: internal error (see the proxy log)", "api_error")

    async def error(self, flow: http.HTTPFlow) -> None:
        self.calls.release(flow)
        try:
            await self.calls.error(flow)
        except Exception:
            log.exception("polar: recording a failed flow failed")
