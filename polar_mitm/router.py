"""Routing + rewrite: each LLM call becomes a token-level request to the inference engine, and the
engine's tokens become the provider's reply, streamed live when asked (DESIGN.md §1, §5, §8)."""
from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from mitmproxy import ctx, http
from mitmproxy.exceptions import OptionsError

from polar_mitm import call as calls
from polar_mitm.capture import Capture, CaptureError
from polar_mitm.conversation import Conversation, ProviderError
from polar_mitm.engine import EngineError, apply_chunk, engine_request, parse_engine
from polar_mitm.model import Model, load_model
from polar_mitm.prompt import SessionHistory
from polar_mitm.providers import CODECS
from polar_mitm.replies import error_response, json_response
from polar_mitm.streaming import StreamTranslator

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Backend:
    scheme: str
    host: str
    port: int


def parse_backend(spec: str) -> Backend:
    parts = urlsplit(spec)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"expected http://host:port, got {spec!r}")
    return Backend(parts.scheme, parts.hostname, parts.port or (443 if parts.scheme == "https" else 80))


class EngineHealth:
    """Is the engine listening? A TCP connect, skipped while it answered recently: a dead engine
    must give the harness the provider's own error, not mitmproxy's 502 page."""

    def __init__(self, backend: Backend, fresh_s: float = 2.0) -> None:
        self.backend, self.fresh_s, self.last_ok = backend, fresh_s, 0.0

    def mark_ok(self) -> None:
        self.last_ok = time.monotonic()

    async def reachable(self) -> bool:
        if time.monotonic() - self.last_ok < self.fresh_s:
            return True
        try:
            _, writer = await asyncio.wait_for(asyncio.open_connection(self.backend.host, self.backend.port), 2.0)
        except (OSError, asyncio.TimeoutError):
            return False
        writer.close()
        self.mark_ok()
        return True


class Router:
    def __init__(self, capture: Capture) -> None:
        self.capture = capture
        self.backend = parse_backend("http://127.0.0.1:30000")
        self.health = EngineHealth(self.backend)
        self.engine = "sglang"
        self.model: Model | None = None
        self.histories: dict[tuple[str, str], SessionHistory] = {}

    def load(self, loader) -> None:
        loader.add_option("polar_backend", str, "http://127.0.0.1:30000", "Inference server base URL.")
        loader.add_option("polar_engine", str, "sglang", "Token API of the backend: sglang (/generate) or vllm.")
        loader.add_option("polar_engine_model", str, "", "Model name sent to a vLLM backend (if it needs one).")
        loader.add_option("polar_tokenizer", str, "", "Model directory (tokenizer + chat template), required.")
        loader.add_option("polar_tool_parser", str, "hermes", "Tool-call syntax the model writes: hermes or qwen3_coder.")
        loader.add_option("polar_reasoning_parser", str, "think", "Reasoning markup: think (<think>…</think>) or none.")
        loader.add_option("polar_max_tokens", int, 2048, "Default max new tokens when a request sets none.")
        loader.add_option("polar_context_length", int, 0, "Context length in tokens; 0 = from the model config.")

    def configure(self, updated) -> None:
        opts = ctx.options
        try:
            if "polar_backend" in updated:
                self.backend = parse_backend(opts.polar_backend)
                self.health = EngineHealth(self.backend)
            if "polar_engine" in updated:
                self.engine = parse_engine(opts.polar_engine)
        except ValueError as e:
            name = "polar_backend" if "polar_backend" in updated else "polar_engine"
            raise OptionsError(f"{name}: {e}") from e
        keys = {"polar_tokenizer", "polar_tool_parser", "polar_reasoning_parser", "polar_context_length"}
        if keys & set(updated) and opts.polar_tokenizer:
            try:
                self.model = load_model(opts.polar_tokenizer, opts.polar_tool_parser,
                                        opts.polar_reasoning_parser, opts.polar_context_length)
            except ValueError as e:
                raise OptionsError(f"polar_tokenizer: {e}") from e

    def running(self) -> None:
        if self.model is None:
            raise OptionsError("polar_tokenizer: set it to the model directory (tokenizer + chat template)")

    # -- request: parse, tokenize, rewrite ---------------------------------------------------------
    async def request(self, flow: http.HTTPFlow) -> None:
        if flow.response or "polar_session" not in flow.metadata:
            return
        route, session = flow.metadata["polar_route"], flow.metadata["polar_session"]
        if route.kind in ("models", "model"):
            flow.response = self._model_list(route)
            return
        call = calls.Call(calls.new_call_id(), session, route, Conversation(route.api, route.model or "", ()), {},
                          time.time())
        try:
            body = self._json_body(flow)
            call.request_body = body
            call.conv = CODECS[route.api].parse_request(body, flow.request.path)
            if route.kind == "generate":
                if not await self.health.reachable():
                    raise ProviderError(503, f"polar: the inference engine at {ctx.options.polar_backend} "
                                             "is unreachable", "api_error")
                self._rewrite(flow, call)
            else:
                flow.response = self._side_answer(route, call.conv)
        except ProviderError as e:
            flow.response = error_response(route.api, e.status, e.message, e.kind)
            if route.kind == "generate":
                try:
                    self._record(call, calls.make_record(call, None, error=e.message))
                except CaptureError as ce:
                    flow.response = error_response(route.api, 500, f"polar: {ce}")

    def _json_body(self, flow: http.HTTPFlow) -> dict[str, Any]:
        if flow.request.method == "GET":
            return {}
        try:
            body = json.loads(flow.request.get_content() or b"")
        except (json.JSONDecodeError, UnicodeDecodeError, ValueError) as e:
            raise ProviderError(400, f"request body is not valid JSON: {e}") from e
        if not isinstance(body, dict):
            raise ProviderError(400, "request body must be a JSON object")
        return body

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

    def _rewrite(self, flow: http.HTTPFlow, call: calls.Call) -> None:
        model = self.model
        history = self.histories.setdefault((call.session.task_id, call.session.session_id), SessionHistory())
        call.prompt = history.build_prompt(call.conv, model.renderer)
        room = model.context_length - len(call.prompt.ids)
        if room <= 0:
            raise ProviderError(400, f"prompt is {len(call.prompt.ids)} tokens; the model's context is "
                                     f"{model.context_length} tokens", "context_length_exceeded")
        max_new = min(call.conv.sampling.max_tokens or ctx.options.polar_max_tokens, room)
        path, body = engine_request(self.engine, call.prompt.ids, call.conv.sampling, max_new, call.conv.stream,
                                    ctx.options.polar_engine_model or None)
        call.detok, call.parser = model.new_decoder(call.call_id)
        flow.request.scheme, flow.request.host, flow.request.port = self.backend.scheme, self.backend.host, self.backend.port
        flow.request.method, flow.request.path = "POST", path
        flow.request.headers.clear()
        flow.request.headers["host"] = f"{self.backend.host}:{self.backend.port}"
        flow.request.headers["content-type"] = "application/json"
        flow.request.content = json.dumps(body).encode()
        flow.metadata["polar_call"] = call

    # -- response: translate and record ------------------------------------------------------------
    def responseheaders(self, flow: http.HTTPFlow) -> None:
        call: calls.Call | None = flow.metadata.get("polar_call")
        if call is None or not call.conv.stream or flow.response.status_code != 200:
            return
        flow.response.stream = StreamTranslator(self.engine, call, self.model, self._finish_stream)
        flow.response.headers.pop("content-length", None)
        flow.response.headers["transfer-encoding"] = "chunked"
        flow.response.headers["content-type"] = "text/event-stream"
        flow.response.headers["cache-control"] = "no-cache"

    def response(self, flow: http.HTTPFlow) -> None:
        call: calls.Call | None = flow.metadata.get("polar_call")
        if call is None or flow.response.stream:
            return  # not ours, or streamed: the stream translator answered and recorded
        try:
            flow.response = self._answer(call, flow.response)
        except CaptureError as e:
            flow.response = error_response(call.route.api, 500, f"polar: {e}")

    def _answer(self, call: calls.Call, engine: http.Response) -> http.Response:
        """The provider's reply to a non-streamed call, recorded before it is returned."""
        api = call.route.api
        try:
            data = json.loads(engine.get_content() or b"{}")
        except (json.JSONDecodeError, ValueError):
            data = {"error": {"message": (engine.get_text(strict=False) or "")[:500]}}
        if engine.status_code != 200:
            message = f"inference engine answered {engine.status_code}: {_engine_message(data)}"
            self._record(call, calls.make_record(call, None, error=message))
            return error_response(api, 400 if engine.status_code == 400 else 502, message)
        self.health.mark_ok()
        try:
            apply_chunk(self.engine, data, call.output)
        except EngineError as e:
            self._record(call, calls.make_record(call, None, error=str(e)))
            return error_response(api, 502, f"polar: {e}")
        calls.feed_ids(call, call.output.output_ids, self.model.stop_ids)
        calls.finish_events(call)
        body = CODECS[api].render_response(self._complete(call))
        self._record(call, calls.make_record(call, body, flags=call.parser.result().flags))
        return json_response(200, body)

    def _complete(self, call: calls.Call):
        """Completion of a finished call; remembered in the session history before the reply goes out,
        so the harness's next request can already extend it."""
        completion = calls.completion_of(call, self.model.stop_ids)
        history = self.histories[(call.session.task_id, call.session.session_id)]
        history.remember(call.prompt, calls.reply_message(completion), calls.call_tokens(call, self.model.stop_ids))
        return completion

    def _finish_stream(self, call: calls.Call, error: str | None):
        """Called by the stream translator once the engine stream ended; returns the Completion."""
        completion = self._complete(call) if error is None else calls.completion_of(call, self.model.stop_ids)
        body = CODECS[call.route.api].render_response(completion)
        self._record(call, calls.make_record(call, body, error=error, flags=call.parser.result().flags))
        return completion

    def error(self, flow: http.HTTPFlow) -> None:
        call: calls.Call | None = flow.metadata.get("polar_call")
        if call is not None and not call.recorded:
            try:
                self._record(call, calls.make_record(call, None, error=f"engine connection failed: {flow.error}"))
            except CaptureError:
                pass

    def _record(self, call: calls.Call, record) -> None:
        call.recorded = True
        self.capture.write(record)


def _engine_message(data: Any) -> str:
    err = data.get("error") if isinstance(data, dict) else None
    if isinstance(err, dict):
        return str(err.get("message", err))
    return str(err or data)[:500]
