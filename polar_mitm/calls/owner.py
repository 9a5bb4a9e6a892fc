"""The owner of an LLM call, from the admitted request to its record (docs/design.md §1, §5, §8).

`serve` reads a call's steps top to bottom: quotas, parse, the session's call cap, the weight-sync fence, the
replica, the prompt and engine request, then the engine, the reply and the record (`complete`; a streamed call
takes those three in `stream`, once mitmproxy connects to the stream relay). Every call ends here: an answered
one, streamed or not, in `finish`; a refused or failed one in `fail`; a stream whose client went away in `lost`.
`record` is the one writer of a call's record. This module writes the call's request (its body and
conversation) and its record claim; the engine side (replica, prompt, engine request, replica bookkeeping) is the
Dispatcher's (calls/dispatch.py), and the relay (calls/relay.py) only carries the stream."""
from __future__ import annotations

import asyncio
import logging
import time
from functools import partial
from typing import Any

from aiohttp import web
from mitmproxy import http

from polar_mitm import bodies
from polar_mitm.calls import call as calls
from polar_mitm.calls.dispatch import OFF_LOOP_BYTES, Dispatcher
from polar_mitm.calls.relay import SSE_HEADERS, StreamRelay
from polar_mitm.calls.streaming import StreamTranslator, incomplete
from polar_mitm.capture import Capture, CaptureError
from polar_mitm.conversation import Completion, Conversation, ProviderError
from polar_mitm.engines.api import EngineError
from polar_mitm.engines.chat import NO_PROMPT_IDS
from polar_mitm.gate.fence import Fence
from polar_mitm.gate.guard import api_of
from polar_mitm.gate.quotas import SessionQuotas
from polar_mitm.providers import CODECS
from polar_mitm.providers.responses import error_response, json_response

log = logging.getLogger(__name__)
TRUNCATED = "truncated"  # the flag of a call whose stream ended early: its record keeps what was received


def check_call_cap(session, number: int) -> None:
    """The session's `number`th LLM call is refused past its cap: a provider error the SDKs do not retry."""
    if session.max_calls is not None and number > session.max_calls:
        if number == session.max_calls + 1:
            log.warning("polar: session %s/%s reached its cap of %d LLM calls; later calls are refused",
                        session.task_id, session.session_id, session.max_calls)
        raise ProviderError(400, f"polar: this session may make {session.max_calls} LLM calls (the task's max_calls); "
                                 f"call {number} is refused")


def _parse(call: calls.Call, path: str, get: bool) -> None:
    """The body as received goes into the record; the conversation is parsed from a copy whose lone
    surrogates (a JSON escape of broken UTF-16) became U+FFFD, which the tokenizer can take."""
    raw = call.raw_body
    body: Any = {}
    if not get:
        try:
            body = bodies.decode(raw)
        except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
            raise ProviderError(400, f"request body is not valid JSON: {e}") from e
    if not isinstance(body, dict):
        raise ProviderError(400, "request body must be a JSON object")
    call.request_body = body
    parsed = bodies.scrub_surrogates(body) if bodies.has_surrogate_escape(raw) else body
    call.conv = CODECS[call.route.api].parse_request(parsed, path)


def _extends(call: calls.Call) -> int:
    """How many leading prompt ids are the parent call's prompt + output (the capture writer then checks
    only the seam), 0 for a prompt rendered in full."""
    return call.prompt.extends if call.prompt is not None and call.prompt.parent_call_id else 0


class CallOwner:
    def __init__(self, capture: Capture, quotas: SessionQuotas, fence: Fence, dispatch: Dispatcher) -> None:
        self.capture, self.quotas, self.fence, self.dispatch = capture, quotas, fence, dispatch
        self.relay = StreamRelay(self)

    # -- the request hook: a call of a known session (gate/auth.py), answered here or routed to the relay -------
    async def serve(self, flow: http.HTTPFlow) -> None:
        if flow.response or "polar_session" not in flow.metadata:
            return
        route, session = flow.metadata["polar_route"], flow.metadata["polar_session"]
        if route.kind in ("models", "model"):
            flow.response = self._model_list(route)
            return
        raw = b"" if flow.request.method == "GET" else flow.request.get_content() or b""
        call = calls.Call(calls.new_call_id(), session, route, Conversation(route.api, route.model or "", ()), {},
                          time.time(), raw_body=raw, large=len(raw) >= OFF_LOOP_BYTES)
        flow.metadata["polar_call"] = call  # from here on, a failure anywhere is recorded against this call
        work, dispatch = self.dispatch.work, self.dispatch
        try:
            self.quotas.admit(flow, (session.task_id, session.session_id), len(raw))
            await work(call, _parse, call, flow.request.path, flow.request.method == "GET")
            if route.kind != "generate":
                flow.response = await work(call, self._count_tokens, route, call.conv)
                return
            check_call_cap(session, flow.metadata.get("polar_call_number", 0))
            await self.fence.hold(flow.id)
            await dispatch.place(call)
            await work(call, dispatch.build, call)
            call.raw_body = b""  # built: the record keeps the parsed request
            if call.conv.stream:
                await self.relay.route(flow, call)
            else:
                flow.response = await self.complete(call)
        except ProviderError as e:
            flow.response = await self.fail(call, e)
        except CaptureError as e:
            flow.response = error_response(route.api, 500, f"polar: {e}")

    async def complete(self, call: calls.Call) -> http.Response:
        """engine → reply → record, for a non-streamed call."""
        data = await self.dispatch.complete(call)
        try:
            self.dispatch.take_answer(call, data)
            if call.prompt is None:
                raise EngineError(NO_PROMPT_IDS)
        except EngineError as e:
            raise ProviderError(502, f"polar: {e}", "api_error") from e
        calls.finish_events(call)
        _, body = await self.finish(call)
        return json_response(200, body)

    # -- the relay's request: engine → reply → record, for a streamed call ------------------------------------
    async def stream(self, call: calls.Call, request: web.Request) -> web.StreamResponse:
        try:
            try:  # nothing has reached the harness before the engine answers: a failed replica is retried on another
                async with self.dispatch.stream(call) as chunks:
                    return await self._relay(call, chunks, request)
            except ProviderError as e:
                return await self._stream_refused(call, e)
        except Exception as e:  # a bug here must still end in the provider's error and a record
            log.exception("polar: call %s: stream relay failed", call.call_id)
            return await self._stream_refused(call, ProviderError(500, f"polar: internal error ({type(e).__name__})",
                                                                  "api_error"))

    async def _relay(self, call: calls.Call, chunks, request: web.Request) -> web.StreamResponse:
        translator = StreamTranslator(call, partial(self.dispatch.take_answer, call))
        response = web.StreamResponse(status=200, headers=SSE_HEADERS)
        await response.prepare(request)
        try:
            await response.write(translator.start())
            try:
                async for chunk in chunks:
                    out = translator.feed(chunk)
                    if out:
                        await response.write(out)
            except ProviderError as e:  # the engine stalled or broke off: the stream had started, no retry
                translator.error = e.message.removeprefix("polar: ")
            except (ConnectionResetError, asyncio.CancelledError):
                raise
            except Exception as e:  # a translation bug: end the stream with the error, record it
                log.exception("polar: call %s: translating the stream failed", call.call_id)
                translator.error = f"internal error in the stream translator ({type(e).__name__})"
            await response.write(await self._end(call, translator))
            await response.write_eof()
        except ConnectionResetError:
            await self.lost(call, "client disconnected")
        except asyncio.CancelledError:
            await self.lost(call, "client disconnected")
            raise
        return response

    async def _end(self, call: calls.Call, translator: StreamTranslator) -> bytes:
        """The stream's last bytes, sent once its record is durable (so the harness's next request always finds
        this call): the reply's end, or the provider's error event for a stream that failed, whose record keeps
        the tokens received so far, flagged truncated."""
        out: list[bytes] = []
        error, truncated = translator.error, False
        try:
            out = [translator.encode(calls.finish_events(call))]
            error = error or incomplete(call)
            truncated = error is not None
            completion, _ = await self.finish(call, error)
        except Exception as e:  # a parser, encoder or capture failure still ends in a record and an error event
            if not isinstance(e, CaptureError):
                log.exception("polar: call %s: finishing the reply failed", call.call_id)
            error = str(e) if isinstance(e, CaptureError) else f"internal error finishing the reply ({type(e).__name__})"
            try:
                await self.record(call, None, error, self._flags(call, truncated))
            except Exception:
                log.exception("polar: call %s: the error record could not be written either", call.call_id)
            return b"".join(out) + translator.error_event(error)
        if error:
            return b"".join(out) + translator.error_event(error)
        return b"".join(out) + translator.finish(completion)

    async def _stream_refused(self, call: calls.Call, e: ProviderError) -> web.Response:
        answer = await self.fail(call, e)  # records the call unless it already was
        return web.Response(status=answer.status_code, body=answer.content, content_type="application/json")

    # -- every call ends in one of these -------------------------------------------------------------------------
    async def finish(self, call: calls.Call, error: str | None = None) -> tuple[Completion, dict]:
        """The end of an answered call, streamed or not: its completion and the provider's body, then its record
        (durable when this returns), then (only once it is on disk) the session history, before the reply goes
        out, so the harness's next request can already extend it. A call that ends with `error` (a stream cut
        short) is recorded with what it received, flagged truncated. Raises CaptureError."""
        completion = calls.completion_of(call, self.dispatch.model.stop_ids)
        body = CODECS[call.route.api].render_response(completion)
        if await self.record(call, body, error, self._flags(call, error is not None)) and error is None:
            self.dispatch.remember(call, completion)
        return completion, body

    async def fail(self, call: calls.Call, e: ProviderError) -> http.Response:
        """The provider's error for a call, recorded when it was an LLM call."""
        if e.status >= 500 or e.status == 413:
            log.error("polar: call %s: %s", call.call_id, e.message)
        if call.route.kind == "generate" and not call.recorded:
            try:
                await self.record(call, None, e.message, tuple(call.flags))
            except CaptureError as ce:
                return error_response(call.route.api, 500, f"polar: {ce}")
        return error_response(call.route.api, e.status, e.message, e.kind)

    async def lost(self, call: calls.Call, why: str) -> None:
        """A streamed call whose client went away, or that never reached the relay: recorded as it stands."""
        if call.recorded:
            return
        try:
            await self.record(call, None, why, self._flags(call, True))
        except CaptureError:
            pass  # logged by Capture; nobody is listening any more

    # A call has one record. The first writer claims it before writing, so a disconnect noticed meanwhile (the
    # error hook, the relay finishing the stream) cannot add a second line with the same call_id, which readers
    # refuse.
    async def record(self, call: calls.Call, response: dict | None, error: str | None, flags: tuple[str, ...]) -> bool:
        """Write the call's record, durable when this returns; False when it already has one (that one stands).
        Raises CaptureError. Cancelled, the write goes on and the claim stands."""
        if call.recorded:
            return False
        record = calls.make_record(call, response, error=error, flags=flags)
        call.recorded = True
        try:
            await self.capture.commit(record, _extends(call))
        except Exception:  # nothing on disk: an error record may still be tried
            call.recorded = False
            raise
        return True

    @staticmethod
    def _flags(call: calls.Call, truncated: bool) -> tuple[str, ...]:
        return (tuple(call.flags) + ((TRUNCATED,) if truncated else ())
                + (call.parser.result().flags if call.parser else ()))

    # -- the flow's other ends --------------------------------------------------------------------------------
    async def refuse(self, flow: http.HTTPFlow, why: str) -> None:
        """The provider's 500, and an error record when the flow is an LLM call of a known session."""
        message = f"polar: {why}; nothing was forwarded"
        try:
            call = flow.metadata.get("polar_call") or self._orphan_call(flow)
            if call is not None:
                flow.response = await self.fail(call, ProviderError(500, message, "api_error"))
                return
        except Exception:
            log.exception("polar: recording the refused call failed")
        flow.response = error_response(api_of(flow), 500, message, "api_error")

    @staticmethod
    def _orphan_call(flow: http.HTTPFlow) -> calls.Call | None:
        route, session = flow.metadata.get("polar_route"), flow.metadata.get("polar_session")
        if route is None or session is None or route.kind != "generate":
            return None
        return calls.Call(calls.new_call_id(), session, route, Conversation(route.api, route.model or "", ()), {},
                          time.time())

    async def error(self, flow: http.HTTPFlow) -> None:
        """mitmproxy gave up on the flow (its client left, or the relay connection failed)."""
        call: calls.Call | None = flow.metadata.get("polar_call")
        if call is None:
            return
        self.relay.drop(call.call_id)
        if not call.recorded and call.route.kind == "generate":
            why = "client disconnected" if "client" in str(flow.error).lower() else f"relay connection failed: {flow.error}"
            try:
                await self.record(call, None, why, tuple(call.flags))
            except CaptureError:
                pass  # logged by Capture; the client is gone

    def release(self, flow: http.HTTPFlow) -> None:
        """The flow ended: its slots in the fence and in its session's quota are free."""
        self.fence.leave(flow.id)
        self.quotas.release(flow)

    # -- answers that are no LLM call ---------------------------------------------------------------------------
    def _count_tokens(self, route, conv: Conversation) -> http.Response:
        """Token counting, answered with the real prompt length."""
        prompt_tokens = len(self.dispatch.model.renderer.render_full(conv))
        return json_response(200, CODECS[route.api].render_count_tokens(prompt_tokens))

    def _model_list(self, route) -> http.Response:
        codec = CODECS[route.api]
        if route.kind == "model":
            if route.api == "gemini":
                return json_response(200, codec.render_model(route.model))
            return json_response(200, codec.render_models([route.model])["data"][0])
        return json_response(200, codec.render_models(self.dispatch.model.served_names))
