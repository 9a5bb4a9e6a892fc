"""Polar's hooks, run in order inside one mitmproxy addon, with every flow sealed.

mitmproxy, when an addon hook raises, logs the error and carries on with the flow as it is, and skips the
script's remaining addons: an untouched request would then go upstream (through HTTPS_PROXY, to the real
provider). So the stages run here, each failure is caught, and a flow leaves `request` only answered
locally or pointed at Polar's own stream relay; anything else is answered with the provider's 500 and
recorded (docs/design.md §2). The connection-layer allowlist in polar_mitm/gate/egress.py backs this up.
"""
from __future__ import annotations

import gc
import logging
import time

from mitmproxy import connection, ctx, http

from polar_mitm.calls import call as calls
from polar_mitm.capture import Capture
from polar_mitm.conversation import Conversation, ProviderError
from polar_mitm.gate.auth import SessionAuth
from polar_mitm.gate.egress import Egress, _Refused
from polar_mitm.gate.fence import Fence
from polar_mitm.gate.guard import Guard, request_headers
from polar_mitm.gate.quotas import SessionQuotas
from polar_mitm.providers.responses import error_response, family_api
from polar_mitm.providers.routes import family_of
from polar_mitm.router import Router
from polar_mitm.sessions.registry import redis_url_of

log = logging.getLogger(__name__)


class Polar:
    def __init__(self) -> None:
        self.capture, self.fence = Capture(), Fence()
        self.egress, self.guard, self.auth, self.quotas = Egress(), Guard(), SessionAuth(), SessionQuotas()
        self.router = Router(self.capture, self.fence, self.quotas)
        self.stages = (self.egress, self.guard, self.auth, self.quotas, self.router, self.capture)

    # -- lifecycle: errors here must stop the proxy, so they are not caught ---------------------------------
    def load(self, loader) -> None:
        for stage in self.stages:
            if hasattr(stage, "load"):
                stage.load(loader)

    def configure(self, updated) -> None:
        for stage in self.stages:
            stage.configure(updated)
        if "polar_sessions" in updated:
            spec = ctx.options.polar_sessions
            self.fence.configure(redis_url_of(spec))

    async def running(self) -> None:
        self.egress.check(ctx.options)
        await self.router.running()
        self.egress.allowed = {self.router.relay.address}
        self.fence.start()
        # what start-up made (mitmproxy, transformers, the tokenizer, the template: ~150k objects) lives as long
        # as the proxy: out of the collector's reach, a full collection scans only what calls made since. Left
        # in, each one paused a call ~90 ms about every 250 calls (bench/sessions.py, one call at a time).
        gc.freeze()

    async def done(self) -> None:
        await self.router.done()
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
        await self._run("http_connect", flow, (self.guard, self.auth))
        if flow.response is None and not flow.metadata.get("polar_connect_ok"):
            flow.response = http.Response.make(502, b"polar: proxy error, CONNECT refused\n", {"content-type": "text/plain"})

    async def request(self, flow: http.HTTPFlow) -> None:
        await self._run("request", flow, (self.guard, self.auth, self.router))
        if flow.response is None and not self._to_relay(flow):
            self._refuse(flow, "the request was neither answered nor routed to the engine")

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        try:
            self.router.responseheaders(flow)
        except Exception:
            log.exception("polar: responseheaders failed on %s", flow.request.path)
            flow.metadata["polar_failed"] = True
            flow.response.stream = False

    def response(self, flow: http.HTTPFlow) -> None:
        self.fence.leave(flow.id)
        self.quotas.release(flow)
        if flow.metadata.get("polar_failed"):
            flow.response = error_response(self._api(flow), 500, "polar: internal error (see the proxy log)", "api_error")

    def error(self, flow: http.HTTPFlow) -> None:
        self.fence.leave(flow.id)
        self.quotas.release(flow)
        try:
            self.router.error(flow)
        except Exception:
            log.exception("polar: recording a failed flow failed")

    async def _run(self, hook: str, flow: http.HTTPFlow, stages: tuple) -> None:
        for stage in stages:
            fn = getattr(stage, hook, None)
            if fn is None:
                continue
            try:
                result = fn(flow)
                if result is not None:
                    await result
            except Exception:
                log.exception("polar: %s.%s failed; the flow is answered here and goes nowhere",
                              type(stage).__name__, hook)
                if hook == "request":
                    self._refuse(flow, f"internal error in {type(stage).__name__}")
                return

    def _to_relay(self, flow: http.HTTPFlow) -> bool:
        relay = self.router.relay
        return (bool(flow.metadata.get("polar_relay")) and relay.address is not None
                and (flow.request.host, flow.request.port) == tuple(relay.address))

    def _refuse(self, flow: http.HTTPFlow, why: str) -> None:
        """The provider's 500, and an error record when the flow is an LLM call of a known session."""
        message = f"polar: {why}; nothing was forwarded"
        try:
            call = flow.metadata.get("polar_call") or self._orphan_call(flow)
            if call is not None:
                flow.response = self.router.dispatch.fail(call, ProviderError(500, message, "api_error"))
                return
        except Exception:
            log.exception("polar: recording the refused call failed")
        flow.response = error_response(self._api(flow), 500, message, "api_error")

    def _orphan_call(self, flow: http.HTTPFlow) -> calls.Call | None:
        route, session = flow.metadata.get("polar_route"), flow.metadata.get("polar_session")
        if route is None or session is None or route.kind != "generate":
            return None
        return calls.Call(calls.new_call_id(), session, route, Conversation(route.api, route.model or "", ()), {},
                          time.time())

    def _api(self, flow: http.HTTPFlow) -> str:
        route = flow.metadata.get("polar_route")
        if route is not None:
            return route.api
        try:
            headers = request_headers(flow)
            return family_api(family_of(flow.request.pretty_host.lower(), headers, flow.request.path))
        except Exception:
            return "openai_chat"
