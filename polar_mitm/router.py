"""Routing + rewrite: each LLM call becomes a token-level request to the inference engine, and the engine's
tokens become the provider's reply (DESIGN.md §1, §5, §8).

Non-streamed calls are sent to the engine by the proxy's own client and answered from the hook; streamed
calls go to the in-process relay (polar_mitm/relay.py), the only upstream mitmproxy may connect to, which
streams the engine's tokens back as the provider's SSE. Either way every call ends in a CallRecord."""
from __future__ import annotations

import json
import logging
import re
import time
from typing import Any, Awaitable, Callable, TypeVar

from mitmproxy import ctx, http
from mitmproxy.exceptions import OptionsError

from polar_mitm import call as calls
from polar_mitm.capture import Capture, CaptureError
from polar_mitm.conversation import Conversation, ProviderError
from polar_mitm.engine import EngineError, apply_chunk, engine_request, parse_engine
from polar_mitm.engine_client import EngineFailure, Timeouts, engine_json, engine_refused
from polar_mitm.engines import Engines, Replica, parse_backends, parse_placement
from polar_mitm.fence import Fence
from polar_mitm.model import Model, load_model
from polar_mitm.prompt import SessionHistory
from polar_mitm.providers import CODECS
from polar_mitm.relay import StreamRelay
from polar_mitm.replies import error_response, json_response
from polar_mitm.session_cache import SessionCache
from polar_mitm.sessions import watch_ended

log = logging.getLogger(__name__)
# A JSON escape of a UTF-16 surrogate: only then can the parsed body hold text the tokenizer cannot take.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_SURROGATE = re.compile("[\ud800-\udfff]")
T = TypeVar("T")


def parse_positive(value: int) -> int:
    if value <= 0:
        raise ValueError(f"expected a positive number, got {value}")
    return value


def scrub_surrogates(value: Any) -> Any:
    """A copy with lone surrogates replaced by U+FFFD, what a lenient UTF-8 decoder gives the tokenizer."""
    if isinstance(value, str):
        return _SURROGATE.sub("\ufffd", value)
    if isinstance(value, list):
        return [scrub_surrogates(v) for v in value]
    if isinstance(value, dict):
        return {scrub_surrogates(k): scrub_surrogates(v) for k, v in value.items()}
    return value


class Router:
    def __init__(self, capture: Capture, fence: Fence) -> None:
        self.capture, self.fence = capture, fence
        self.engine = "sglang"
        self.model: Model | None = None
        self.engines = Engines()
        self.relay = StreamRelay(self)
        self.histories: SessionCache[tuple[str, str], SessionHistory] = SessionCache(SessionHistory)
        self._warned: set[tuple[str, str]] = set()

    def load(self, loader) -> None:
        loader.add_option("polar_backend", str, "http://127.0.0.1:30000",
                          "Inference server base URL; several replicas comma-separated (sessions stick to one).")
        loader.add_option("polar_engine_placement", str, "least_loaded",
                          "Where a new session goes: least_loaded (fewest calls in flight) or round_robin.")
        loader.add_option("polar_engine_probe_interval", int, 5, "Seconds between health probes of each engine.")
        loader.add_option("polar_engine_status_interval", int, 60,
                          "Seconds between log lines of per-engine calls in flight and sessions; 0 = off.")
        loader.add_option("polar_engine", str, "sglang", "Token API of the backend: sglang (/generate) or vllm.")
        loader.add_option("polar_engine_model", str, "", "Model name sent to a vLLM backend (if it needs one).")
        loader.add_option("polar_tokenizer", str, "", "Model directory (tokenizer + chat template), required.")
        loader.add_option("polar_tool_parser", str, "hermes", "Tool-call syntax the model writes: hermes or qwen3_coder.")
        loader.add_option("polar_reasoning_parser", str, "think", "Reasoning markup: think (<think>…</think>) or none.")
        loader.add_option("polar_max_tokens", int, 2048, "Default max new tokens when a request sets none.")
        loader.add_option("polar_context_length", int, 0, "Context length in tokens; 0 = from the model config.")
        loader.add_option("polar_engine_timeout", int, 600, "Seconds a whole engine call may take.")
        loader.add_option("polar_engine_first_byte_timeout", int, 120,
                          "Streams: seconds until the engine's first byte, and between two chunks.")
        loader.add_option("polar_session_ttl", int, 3600, "Seconds an idle session's history is kept.")
        loader.add_option("polar_max_sessions", int, 10000, "Most session histories kept (least recently used go).")

    def configure(self, updated) -> None:
        opts = ctx.options
        for name in ("polar_backend", "polar_engine", "polar_engine_timeout", "polar_engine_first_byte_timeout",
                     "polar_engine_placement", "polar_engine_probe_interval", "polar_engine_status_interval",
                     "polar_session_ttl", "polar_max_sessions", "polar_max_tokens"):
            if name in updated:
                try:
                    self._configure_one(name, getattr(opts, name))
                except ValueError as e:
                    raise OptionsError(f"{name}: {e}") from e
        keys = {"polar_tokenizer", "polar_tool_parser", "polar_reasoning_parser", "polar_context_length"}
        if keys & set(updated) and opts.polar_tokenizer:
            try:
                self.model = load_model(opts.polar_tokenizer, opts.polar_tool_parser,
                                        opts.polar_reasoning_parser, opts.polar_context_length)
            except ValueError as e:
                raise OptionsError(f"polar_tokenizer: {e}") from e

    def _configure_one(self, name: str, value: Any) -> None:
        opts = ctx.options
        if name == "polar_engine":
            self.engine = parse_engine(value)
        elif name in ("polar_backend", "polar_engine_timeout", "polar_engine_first_byte_timeout",
                      "polar_engine_placement"):
            timeouts = Timeouts(parse_positive(opts.polar_engine_timeout), parse_positive(opts.polar_engine_first_byte_timeout))
            self.engines.configure(parse_backends(opts.polar_backend), timeouts,
                                   parse_placement(opts.polar_engine_placement))
        elif name == "polar_engine_status_interval":
            if value < 0:
                raise ValueError(f"expected 0 (off) or a number of seconds, got {value}")
        elif name in ("polar_session_ttl", "polar_max_sessions"):
            self.histories.ttl_s, self.histories.max_entries = parse_positive(opts.polar_session_ttl), parse_positive(
                opts.polar_max_sessions)
        else:
            parse_positive(value)

    async def running(self) -> None:
        if self.model is None:
            raise OptionsError("polar_tokenizer: set it to the model directory (tokenizer + chat template)")
        await self.relay.start()
        opts = ctx.options
        redis_url = opts.polar_sessions if opts.polar_sessions.startswith(("redis://", "unix://")) else None
        if redis_url:
            watch_ended(redis_url, lambda task_id, session_id: self.histories.drop((task_id, session_id)))
        await self.engines.start(redis_url, opts.polar_session_ttl, opts.polar_engine_probe_interval,
                                 opts.polar_engine_status_interval, self._sessions_per_engine)

    async def done(self) -> None:
        await self.relay.stop()
        await self.engines.stop()

    def _sessions_per_engine(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for history in self.histories.values():
            if history.engine:
                counts[history.engine] = counts.get(history.engine, 0) + 1
        return counts

    # -- request: parse, tokenize, then answer (non-streamed) or hand to the relay (streamed) ----------------
    async def request(self, flow: http.HTTPFlow) -> None:
        if flow.response or "polar_session" not in flow.metadata:
            return
        route, session = flow.metadata["polar_route"], flow.metadata["polar_session"]
        if route.kind in ("models", "model"):
            flow.response = self._model_list(route)
            return
        call = calls.Call(calls.new_call_id(), session, route, Conversation(route.api, route.model or "", ()), {},
                          time.time())
        flow.metadata["polar_call"] = call  # from here on, a failure anywhere is recorded against this call
        try:
            body = self._json_body(flow, call)
            call.conv = CODECS[route.api].parse_request(body, flow.request.path)
            if route.kind != "generate":
                flow.response = self._side_answer(route, call.conv)
                return
            await self.fence.hold(flow.id)
            await self.place(call)
            self._build(call)
            if call.conv.stream:
                self.relay.route(flow, call)
            else:
                flow.response = await self._complete_call(call)
        except ProviderError as e:
            flow.response = self.fail(call, e)
        except CaptureError as e:
            flow.response = error_response(route.api, 500, f"polar: {e}")

    def _json_body(self, flow: http.HTTPFlow, call: calls.Call) -> dict[str, Any]:
        """The body as received goes into the record; the conversation is parsed from a copy whose lone
        surrogates (a JSON escape of broken UTF-16) became U+FFFD, which the tokenizer can take."""
        if flow.request.method == "GET":
            return {}
        try:
            raw = flow.request.get_content() or b""
            body = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError, ValueError) as e:
            raise ProviderError(400, f"request body is not valid JSON: {e}") from e
        if not isinstance(body, dict):
            raise ProviderError(400, "request body must be a JSON object")
        call.request_body = body
        return scrub_surrogates(body) if _SURROGATE_ESCAPE.search(raw) else body

    def _side_answer(self, route, conv: Conversation) -> http.Response:
        """Token counting, answered with the real prompt length."""
        return json_response(200, CODECS[route.api].render_count_tokens(len(self.model.renderer.render_full(conv))))

    def _model_list(self, route) -> http.Response:
        codec = CODECS[route.api]
        if route.kind == "model":
            if route.api == "gemini":
                return json_response(200, codec.render_model(route.model))
            return json_response(200, codec.render_models([route.model])["data"][0])
        return json_response(200, codec.render_models(self.model.served_names))

    async def place(self, call: calls.Call, tried: frozenset[str] = frozenset()) -> Replica:
        key = (call.session.task_id, call.session.session_id)
        replica = await self.engines.place(key, self.histories.get(key), tried)
        call.engine = replica.url
        return replica

    async def on_replica(self, call: calls.Call, send: Callable[[Replica], Awaitable[T]]) -> tuple[Replica, T]:
        """`send(replica)` on the call's replica; when a replica fails before answering, again on another one
        (fail_over). Raises ProviderError when none answers."""
        replica, tried = self.engines.pool.get(call.engine), set()
        while True:
            try:
                return replica, await send(replica)
            except EngineFailure as e:
                replica = await self.fail_over(call, replica, e, tried)

    async def fail_over(self, call: calls.Call, replica: Replica, e: EngineFailure, tried: set[str]) -> Replica:
        """`replica` failed the call: mark it down, and when nothing of the call has reached the harness yet,
        move the session to another replica and rebuild the prompt there (rendered in full). Raises `e` when
        the call cannot be retried or every replica has been tried."""
        self.engines.pool.mark_down(replica, e.message.removeprefix("polar: "))
        tried.add(replica.url)
        if not e.retry or len(tried) >= len(self.engines.pool.replicas):
            raise e
        moved = await self.place(call, frozenset(tried))
        log.warning("polar: call %s: %s failed before generating; retried on %s", call.call_id, replica.url, moved.url)
        call.flags.clear()
        self._build(call)
        return moved

    def _build(self, call: calls.Call) -> None:
        """Prompt ids (with history substitution) and the engine request."""
        model = self.model
        key = (call.session.task_id, call.session.session_id)
        call.prompt = self.histories.get(key).build_prompt(call.conv, model.renderer)
        room = model.context_length - len(call.prompt.ids)
        if room <= 0:
            raise ProviderError(400, f"prompt is {len(call.prompt.ids)} tokens; the model's context is "
                                     f"{model.context_length} tokens", "context_length_exceeded")
        max_new = min(call.conv.sampling.max_tokens or ctx.options.polar_max_tokens, room)
        call.engine_request = engine_request(self.engine, call.prompt.ids, call.conv.sampling, max_new,
                                             call.conv.stream, ctx.options.polar_engine_model or None)
        call.detok, call.parser = model.new_decoder(call.call_id)
        call.flags.extend(model.dropped_by_template(call.conv))
        if call.flags and key not in self._warned:
            if len(self._warned) > 10_000:
                self._warned.clear()
            self._warned.add(key)
            log.warning("polar: session %s/%s: the chat template of %s drops %s; the model cannot see them",
                        *key, ctx.options.polar_tokenizer, ", ".join(call.flags))

    async def _complete_call(self, call: calls.Call) -> http.Response:
        """The provider's reply to a non-streamed call, recorded before it is returned."""
        async def complete(replica: Replica) -> tuple[int, bytes]:
            replica.inflight += 1
            try:
                return await replica.client.complete(*call.engine_request)  # rebuilt by a fail_over
            finally:
                replica.inflight -= 1

        replica, (status, raw) = await self.on_replica(call, complete)
        replica.served += 1
        data = engine_json(raw)
        if status != 200:
            raise engine_refused(status, data)
        try:
            apply_chunk(self.engine, data, call.output)
        except EngineError as e:
            raise ProviderError(502, f"polar: {e}", "api_error") from e
        calls.feed_ids(call, call.output.output_ids, self.model.stop_ids)
        calls.finish_events(call)
        completion = calls.completion_of(call, self.model.stop_ids)
        body = CODECS[call.route.api].render_response(completion)
        self.finish(call, completion, body, None)
        return json_response(200, body)

    def finish(self, call: calls.Call, completion, body: dict | None, error: str | None) -> None:
        """Record the call, then (only once it is on disk) remember it in the session history, before the reply
        goes out, so the harness's next request can already extend it. Raises CaptureError."""
        if self._record(call, calls.make_record(call, body, error=error, flags=self._flags(call))) and error is None:
            self._remember(call, completion)

    @staticmethod
    def _flags(call: calls.Call) -> tuple[str, ...]:
        return tuple(call.flags) + (call.parser.result().flags if call.parser else ())

    def _remember(self, call: calls.Call, completion) -> None:
        history = self.histories.peek((call.session.task_id, call.session.session_id))
        if history is not None and history.engine == call.engine:  # not a session that moved meanwhile
            history.remember(call.prompt, calls.reply_message(completion), calls.call_tokens(call, self.model.stop_ids))

    def fail(self, call: calls.Call, e: ProviderError) -> http.Response:
        """The provider's error for a call, recorded when it was an LLM call."""
        if e.status >= 500 or e.status == 413:
            log.error("polar: call %s: %s", call.call_id, e.message)
        if call.route.kind == "generate" and not call.recorded:
            try:
                self._record(call, calls.make_record(call, None, error=e.message, flags=tuple(call.flags)))
            except CaptureError as ce:
                return error_response(call.route.api, 500, f"polar: {ce}")
        return error_response(call.route.api, e.status, e.message, e.kind)

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        if flow.metadata.get("polar_relay"):
            self.relay.pass_through(flow)

    def error(self, flow: http.HTTPFlow) -> None:
        call: calls.Call | None = flow.metadata.get("polar_call")
        if call is not None and not call.recorded and call.route.kind == "generate":
            why = "client disconnected" if "client" in str(flow.error).lower() else f"relay connection failed: {flow.error}"
            try:
                self._record(call, calls.make_record(call, None, error=why, flags=tuple(call.flags)))
            except CaptureError:
                pass  # logged by Capture; the client is gone

    # A call has one record. The first writer claims it before writing, so a disconnect noticed meanwhile (the
    # error hook, the relay finishing the stream) cannot add a second line with the same call_id, which readers
    # refuse.
    def _record(self, call: calls.Call, record) -> bool:
        """Write the call's record; False when it already has one (that one stands)."""
        if call.recorded:
            return False
        call.recorded = True
        try:
            self.capture.write(record)
        except Exception:
            call.recorded = False  # nothing on disk: an error record may still be tried
            raise
        return True
