"""Routing + rewrite: each LLM call becomes a token-level request to the inference engine, and the engine's
tokens become the provider's reply (docs/design.md §1, §5, §8).

Non-streamed calls are sent to the engine by the proxy's own client and answered from the hook; streamed
calls go to the in-process relay (polar_mitm/calls/relay.py), the only upstream mitmproxy may connect to, which
streams the engine's tokens back as the provider's SSE. Both hand the call's engine side (replica, prompt,
retry, record) to one Dispatcher (polar_mitm/calls/dispatch.py). Either way every call ends in a CallRecord."""
from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from mitmproxy import ctx, http
from mitmproxy.exceptions import OptionsError

from polar_mitm.calls import call as calls
from polar_mitm.calls.dispatch import HISTORY_CHECKS, OFF_LOOP_BYTES, Dispatcher
from polar_mitm.calls.relay import StreamRelay
from polar_mitm.capture import MAX_BYTES as CAPTURE_MAX_BYTES
from polar_mitm.capture import Capture, CaptureError
from polar_mitm.conversation import Conversation, ProviderError
from polar_mitm.engines.api import parse_engine
from polar_mitm.engines.backends import parse_backends, parse_placement
from polar_mitm.engines.chat import RENDERS
from polar_mitm.engines.client import Timeouts
from polar_mitm.engines.replicas import Engines
from polar_mitm.gate.fence import Fence
from polar_mitm.gate.quotas import SessionQuotas
from polar_mitm.providers import CODECS
from polar_mitm.providers.responses import error_response, json_response
from polar_mitm.sessions.cache import SessionCache
from polar_mitm.sessions.registry import redis_url_of, watch_ended
from polar_mitm.status_file import INTERVAL_S as STATUS_INTERVAL_S
from polar_mitm.status_file import write_status
from polar_mitm.tokens.model import load_model
from polar_mitm.tokens.prefix_cache import BYTES_PER_ID as CACHE_BYTES_PER_ID
from polar_mitm.tokens.prefix_cache import MAX_IDS
from polar_mitm.tokens.prompt import SessionHistory
from polar_traj.captures import loads_line

log = logging.getLogger(__name__)
# A JSON escape of a UTF-16 surrogate: only then can the parsed body hold text the tokenizer cannot take.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_SURROGATE = re.compile("[\ud800-\udfff]")


def _has_surrogate_escape(raw: bytes) -> bool:
    # two substring searches (memchr speed) rule out almost every body before the regex (~4 ns a byte) runs
    return (b"\\ud" in raw or b"\\uD" in raw) and _SURROGATE_ESCAPE.search(raw) is not None


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


def check_call_cap(session, number: int) -> None:
    """The session's `number`th LLM call is refused past its cap: a provider error the SDKs do not retry."""
    if session.max_calls is not None and number > session.max_calls:
        if number == session.max_calls + 1:
            log.warning("polar: session %s/%s reached its cap of %d LLM calls; later calls are refused",
                        session.task_id, session.session_id, session.max_calls)
        raise ProviderError(400, f"polar: this session may make {session.max_calls} LLM calls (the task's max_calls); "
                                 f"call {number} is refused")


# what the budget holds besides histories, at their fixed bounds: the shared-prefix and render caches' ids and
# the capture writer's remembered records
FIXED_BYTES = 2 * MAX_IDS * CACHE_BYTES_PER_ID + CAPTURE_MAX_BYTES


def histories_budget(budget: int) -> int:
    """Bytes left to session histories by a polar_memory_budget (0: unbounded); ValueError when the budget does
    not even hold the caches."""
    if budget < 0:
        raise ValueError(f"expected 0 (no bound) or a number of bytes, got {budget}")
    if budget and budget <= FIXED_BYTES:
        raise ValueError(f"{budget} bytes does not hold the prompt caches and the capture writer "
                         f"({FIXED_BYTES / 2**20:.0f} MB at their fixed bounds): give more")
    return budget - FIXED_BYTES if budget else 0


class Router:
    def __init__(self, capture: Capture, fence: Fence, quotas: SessionQuotas) -> None:
        self.fence, self.quotas = fence, quotas
        self.engines = Engines()
        self.histories: SessionCache[tuple[str, str], SessionHistory] = SessionCache(SessionHistory,
                                                                                     weigh=SessionHistory.nbytes)
        self.dispatch = Dispatcher(capture, self.engines, self.histories)
        self.relay = StreamRelay(self.dispatch)
        self.formats = ""  # who renders and parses, and how: said at start (logged here, printed by polar proxy)
        self._ended_watch: asyncio.Task[None] | None = None
        self._status_task: asyncio.Task[None] | None = None
        self._status_path: Path | None = None

    def load(self, loader) -> None:
        loader.add_option("polar_backend", str, "http://127.0.0.1:30000",
                          "Inference server base URL; several replicas comma-separated (sessions stick to one).")
        loader.add_option("polar_engine_placement", str, "least_loaded",
                          "Where a new session goes: least_loaded (fewest calls in flight) or round_robin.")
        loader.add_option("polar_engine_probe_interval", int, 5, "Seconds between health probes of each engine.")
        loader.add_option("polar_engine_start_grace", int, 30,
                          "Seconds after the start in which probes do not mark down an engine that never answered.")
        loader.add_option("polar_engine_status_interval", int, 60,
                          "Seconds between log lines of per-engine calls in flight and sessions; 0 = off.")
        loader.add_option("polar_engine", str, "sglang", "Token API of the backend: sglang (/generate) or vllm.")
        loader.add_option("polar_engine_model", str, "", "Model name sent to a vLLM backend (if it needs one).")
        loader.add_option("polar_tokenizer", str, "", "Model directory (tokenizer + chat template), required.")
        loader.add_option("polar_tool_parser", str, "auto",
                          "Tool-call syntax the model writes: auto (read from the chat template), a parser's name "
                          "(polar_mitm/tokens/reply_parser.py CALL_FORMATS, harmony) or none.")
        loader.add_option("polar_reasoning_parser", str, "auto",
                          "Reasoning markup: auto (from the chat template), think (<think>…</think>), mistral "
                          "([THINK]…[/THINK]), harmony or none.")
        loader.add_option("polar_max_tokens", int, 2048, "Default max new tokens when a request sets none.")
        loader.add_option("polar_context_length", int, 0, "Context length in tokens; 0 = from the model config.")
        loader.add_option("polar_engine_timeout", int, 600, "Seconds a whole engine call may take.")
        loader.add_option("polar_engine_first_byte_timeout", int, 120,
                          "Streams: seconds until the engine's first byte, and between two chunks.")
        loader.add_option("polar_session_ttl", int, 3600, "Seconds an idle session's history is kept.")
        loader.add_option("polar_max_sessions", int, 10000, "Most session histories kept (least recently used go).")
        loader.add_option("polar_memory_budget", int, 0,
                          "Bytes for session histories, prompt caches and the capture writer together; past it the "
                          "least recently used sessions' histories go (their next call rendered in full, "
                          "rendered:evicted). 0 = no bound but polar_max_sessions.")
        loader.add_option("polar_status_file", str, "",
                          "JSON file rewritten every few seconds with this proxy's pid, RSS and session memory "
                          "(`polar status` shows it for a node's proxies); removed at a clean stop. Empty = none.")
        loader.add_option("polar_render", str, "proxy",
                          "Who renders prompts and parses replies: proxy (the model's chat template here, history "
                          "substituted, token-exact) or engine (the engine's chat API with token ids: any model the "
                          "engine supports; each call rendered in full, prefix_source rendered:engine).")
        loader.add_option("polar_history_check", str, "sampled",
                          "Compare substituted prompts with the chat template's own rendering and flag the "
                          "difference: sampled (a session's 1st, 2nd, 4th, 8th... substituted call), all, off.")

    def configure(self, updated) -> None:
        opts = ctx.options
        if "polar_engine_start_grace" in updated and opts.polar_engine_start_grace < 0:
            raise OptionsError(f"polar_engine_start_grace: expected 0 (none) or a number of seconds, "
                               f"got {opts.polar_engine_start_grace}")
        for name in ("polar_backend", "polar_engine", "polar_engine_timeout", "polar_engine_first_byte_timeout",
                     "polar_engine_placement", "polar_engine_probe_interval", "polar_engine_status_interval",
                     "polar_engine_start_grace",
                     "polar_session_ttl", "polar_max_sessions", "polar_max_tokens", "polar_engine_model",
                     "polar_memory_budget"):
            if name in updated:
                try:
                    self._configure_one(name, getattr(opts, name))
                except ValueError as e:
                    raise OptionsError(f"{name}: {e}") from e
        if "polar_tokenizer" in updated:
            self.dispatch.options = replace(self.dispatch.options, tokenizer=opts.polar_tokenizer)
        if "polar_history_check" in updated:
            if opts.polar_history_check not in HISTORY_CHECKS:
                raise OptionsError(f"polar_history_check: expected one of {', '.join(HISTORY_CHECKS)}, "
                                   f"got {opts.polar_history_check!r}")
            self.dispatch.options = replace(self.dispatch.options, history_check=opts.polar_history_check)
        if "polar_render" in updated:
            if opts.polar_render not in RENDERS:
                raise OptionsError(f"polar_render: expected one of {', '.join(RENDERS)}, got {opts.polar_render!r}")
            self.dispatch.options = replace(self.dispatch.options, render=opts.polar_render)
        keys = {"polar_tokenizer", "polar_tool_parser", "polar_reasoning_parser", "polar_context_length",
                "polar_render"}
        if keys & set(updated) and opts.polar_tokenizer:
            engine_renders = opts.polar_render == "engine"  # its template and parsers: none of ours to pick
            try:
                self.dispatch.model = load_model(opts.polar_tokenizer,
                                                 "none" if engine_renders else opts.polar_tool_parser,
                                                 "none" if engine_renders else opts.polar_reasoning_parser,
                                                 opts.polar_context_length)
            except ValueError as e:
                raise OptionsError(f"polar_tokenizer: {e}") from e
            model = self.dispatch.model
            self.formats = ("the engine renders prompts and parses replies (--render engine)" if engine_renders else
                            f"tool calls {model.tool_parser or 'none'}, reasoning {model.reasoning_parser or 'none'} "
                            f"({model.family})")
            log.info("polar: model %s: %s", model.served_names[0], self.formats)

    def _configure_one(self, name: str, value: Any) -> None:
        opts, dispatch = ctx.options, self.dispatch
        if name == "polar_engine":
            dispatch.options = replace(dispatch.options, engine=parse_engine(value))
        elif name == "polar_max_tokens":
            dispatch.options = replace(dispatch.options, max_tokens=parse_positive(value))
        elif name == "polar_engine_model":
            dispatch.options = replace(dispatch.options, engine_model=value or None)
        elif name in ("polar_backend", "polar_engine_timeout", "polar_engine_first_byte_timeout",
                      "polar_engine_placement", "polar_engine_start_grace"):
            timeouts = Timeouts(parse_positive(opts.polar_engine_timeout), parse_positive(opts.polar_engine_first_byte_timeout))
            self.engines.configure(parse_backends(opts.polar_backend), timeouts,
                                   parse_placement(opts.polar_engine_placement), opts.polar_engine_start_grace)
        elif name == "polar_engine_status_interval":
            if value < 0:
                raise ValueError(f"expected 0 (off) or a number of seconds, got {value}")
        elif name == "polar_memory_budget":
            self.histories.max_weight = histories_budget(value)
        elif name in ("polar_session_ttl", "polar_max_sessions"):
            self.histories.ttl_s, self.histories.max_entries = parse_positive(opts.polar_session_ttl), parse_positive(
                opts.polar_max_sessions)
        else:
            parse_positive(value)

    async def running(self) -> None:
        if self.dispatch.model is None:
            raise OptionsError("polar_tokenizer: set it to the model directory (tokenizer + chat template)")
        await self.relay.start()
        opts = ctx.options
        redis_url = redis_url_of(opts.polar_sessions)
        if redis_url:
            # held: the loop keeps tasks only weakly; a collected one is gone, and the error it logs during start-up
            # makes mitmdump exit
            self._ended_watch = watch_ended(redis_url, self._session_ended)
        await self.engines.start(redis_url, opts.polar_session_ttl, opts.polar_engine_probe_interval,
                                 opts.polar_engine_status_interval, self.dispatch.sessions_per_engine,
                                 self.dispatch.memory_line)
        if opts.polar_status_file:
            self._status_path = Path(opts.polar_status_file)
            self._status_task = asyncio.get_running_loop().create_task(self._write_status(self._status_path))

    async def _write_status(self, path: Path) -> None:
        while True:
            try:
                write_status(path, self.dispatch.memory_figures())
            except OSError as e:  # a full disk must not stop the proxy; the reader sees the file go stale
                log.warning("polar: status file %s: %s", path, e)
            await asyncio.sleep(STATUS_INTERVAL_S)

    def _session_ended(self, task_id: str, session_id: str) -> None:
        self.histories.drop((task_id, session_id))
        self.dispatch.capture.forget(task_id, session_id)

    async def done(self) -> None:
        for task in (self._ended_watch, self._status_task):
            if task is not None:
                task.cancel()
        if self._status_path is not None:
            self._status_path.unlink(missing_ok=True)  # stopped, not stale
        await self.relay.stop()
        await self.engines.stop()
        self.dispatch.close()

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
            call.raw_body = b"" if flow.request.method == "GET" else flow.request.get_content() or b""
            self.quotas.admit(flow, (session.task_id, session.session_id), len(call.raw_body))
            call.large = len(call.raw_body) >= OFF_LOOP_BYTES
            work = self.dispatch.work
            await work(call, self._parse, call, flow.request.path, flow.request.method == "GET")
            if route.kind != "generate":
                flow.response = await work(call, self._side_answer, route, call.conv)
                return
            check_call_cap(session, flow.metadata.get("polar_call_number", 0))
            await self.fence.hold(flow.id)
            await self.dispatch.place(call)
            await work(call, self.dispatch.build, call)
            if call.conv.stream:
                self.relay.route(flow, call)
            else:
                flow.response = await self.dispatch.complete(call)
        except ProviderError as e:
            flow.response = await self.dispatch.fail_async(call, e)
        except CaptureError as e:
            flow.response = error_response(route.api, 500, f"polar: {e}")

    def _parse(self, call: calls.Call, path: str, get: bool) -> None:
        """The body as received goes into the record; the conversation is parsed from a copy whose lone
        surrogates (a JSON escape of broken UTF-16) became U+FFFD, which the tokenizer can take."""
        raw = call.raw_body
        body: Any = {}
        if not get:
            try:
                body = loads_line(raw)  # orjson; the stdlib for what it refuses (lone surrogate escapes, NaN)
            except (json.JSONDecodeError, UnicodeDecodeError, ValueError) as e:
                raise ProviderError(400, f"request body is not valid JSON: {e}") from e
        if not isinstance(body, dict):
            raise ProviderError(400, "request body must be a JSON object")
        call.request_body = body
        parsed = scrub_surrogates(body) if _has_surrogate_escape(raw) else body
        call.conv = CODECS[call.route.api].parse_request(parsed, path)

    def _side_answer(self, route, conv: Conversation) -> http.Response:
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

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        if flow.metadata.get("polar_relay"):
            self.relay.pass_through(flow)

    def error(self, flow: http.HTTPFlow) -> None:
        call: calls.Call | None = flow.metadata.get("polar_call")
        if call is not None:
            self.relay.drop(call.call_id)
        if call is not None and not call.recorded and call.route.kind == "generate":
            why = "client disconnected" if "client" in str(flow.error).lower() else f"relay connection failed: {flow.error}"
            try:
                self.dispatch.record(call, calls.make_record(call, None, error=why, flags=tuple(call.flags)))
            except CaptureError:
                pass  # logged by Capture; the client is gone
