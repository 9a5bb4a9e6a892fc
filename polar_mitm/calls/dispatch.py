"""A call's engine side, shared by the router (polar_mitm/router.py) and the stream relay (polar_mitm/calls/relay.py):
its replica (placement, and a retry on another replica when one fails before answering), its prompt and engine
request, the non-streamed answer, and the one record every call ends in."""
from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, TypeVar

from mitmproxy import http

from polar_mitm.calls import call as calls
from polar_mitm.capture import Capture, CaptureError
from polar_mitm.conversation import ProviderError
from polar_mitm.engines.api import EngineError, apply_chunk, engine_request
from polar_mitm.engines.chat import NO_PROMPT_IDS, EngineReply, chat_request
from polar_mitm.engines.client import EngineFailure, engine_json, engine_refused
from polar_mitm.engines.replicas import Engines, Replica
from polar_mitm.providers import CODECS
from polar_mitm.providers.responses import error_response, json_response
from polar_mitm.sessions.cache import SessionCache
from polar_mitm.sessions.sampling import apply_fixed
from polar_mitm.tokens.model import Model
from polar_mitm.tokens.prompt import SessionHistory, template_difference

log = logging.getLogger(__name__)
T = TypeVar("T")
# A call with a body this large is parsed, rendered, tokenized and recorded on a small thread pool, not on the
# event loop that serves every other session's calls (the tokenizer and file writes release the GIL; a JSON
# parse of many small objects does not, and stays the one cost a large body puts on the loop).
OFF_LOOP_BYTES = 1 * 2**20
OFF_LOOP_THREADS = 2


@dataclass(frozen=True)
class CallOptions:
    """What each call reads of the proxy's options, parsed once by Router.configure."""

    engine: str = "sglang"  # the token API (polar_engine)
    max_tokens: int = 2048  # when a request sets none (polar_max_tokens)
    engine_model: str | None = None  # the model name a vLLM backend is sent (polar_engine_model)
    tokenizer: str = ""  # the model directory, named in warnings (polar_tokenizer)
    history_check: str = "sampled"  # compare substituted prompts with the template's rendering (polar_history_check)
    render: str = "proxy"  # proxy: our template and parsers; engine: the engine's chat API (polar_render)


HISTORY_CHECKS = ("sampled", "all", "off")
HISTORY_DIFFERS = "history_differs_from_template"  # + ":N", the tokens that differ


def history_check_due(check: str, substituted: int) -> bool:
    """`sampled`: a session's 1st, 2nd, 4th, 8th… substituted prompt (a difference, once made, stays in the
    history, so it is seen within twice the turns, at a full render per doubling); `all`: each one."""
    return check == "all" or (check == "sampled" and substituted & (substituted - 1) == 0)


def check_fits(model: Model, conv) -> None:
    """Refuse, before any tokenizing, a conversation whose text alone needs more tokens than the context:
    no token holds more than `model.max_token_bytes` characters, so that many characters is at least one token
    each (a session's 30 MiB prompt costs no tokenizer time)."""
    if not model.max_token_bytes:
        return
    chars = sum(len(m.content) for m in conv.messages)
    floor = chars // model.max_token_bytes
    if floor > model.context_length:
        raise ProviderError(400, f"prompt is at least {floor} tokens ({chars} characters); the model's context is "
                                 f"{model.context_length} tokens", "context_length_exceeded")


class Dispatcher:
    def __init__(self, capture: Capture, engines: Engines,
                 histories: SessionCache[tuple[str, str], SessionHistory]) -> None:
        self.capture, self.engines, self.histories = capture, engines, histories
        self.options = CallOptions()
        self.model: Model | None = None
        self._warned: set[tuple[str, str]] = set()
        self._pool = ThreadPoolExecutor(OFF_LOOP_THREADS, thread_name_prefix="polar-large-call")

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    async def work(self, call: calls.Call, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)` here for a small call; on the pool for a large one, so the loop serves the others."""
        if not call.large:
            return fn(*args)
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    def sessions_per_engine(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for history in self.histories.values():
            if history.engine:
                counts[history.engine] = counts.get(history.engine, 0) + 1
        return counts

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
        self.build(call)
        return moved

    def build(self, call: calls.Call) -> None:
        """Prompt ids (with history substitution) and the engine request."""
        model, options = self.model, self.options
        if options.render == "engine":
            self._build_for_engine(call)
            return
        key = (call.session.task_id, call.session.session_id)
        try:
            check_fits(model, call.conv)
            history = self.histories.get(key)
            prompt = history.build_prompt(call.conv, model.renderer)
            room = model.context_length - len(prompt.ids)
            if room <= 0:  # the record keeps no prompt ids: nothing was sampled from them
                raise ProviderError(400, f"prompt is {len(prompt.ids)} tokens; the model's context is "
                                         f"{model.context_length} tokens", "context_length_exceeded")
        except ProviderError as e:
            # An engine that never answered never said its context either: the one checked is the model config's
            # guess, and the cause to report is the engine (a Codex run said "context" with the engine down).
            if e.kind == "context_length_exceeded" and (why := self.engines.pool.unreachable()) is not None:
                raise ProviderError(503, f"polar: the inference engine is unreachable: {why} (and {e.message}, a "
                                         "context from the model's config: the engine never said its own)",
                                    "overloaded_error") from e
            raise
        call.prompt = prompt
        sampling, overridden = apply_fixed(call.conv.sampling, call.session.sampling)
        max_new = min(sampling.max_tokens or options.max_tokens, room)
        call.engine_request = engine_request(options.engine, call.prompt.ids, sampling, max_new,
                                             call.conv.stream, options.engine_model)
        call.raw_body = b""  # sent: the record keeps the parsed request
        call.detok, call.parser = model.new_decoder(call.call_id)
        if prompt.source == "substituted" and history_check_due(options.history_check, history.substituted):
            try:
                differ = template_difference(prompt.ids, model.renderer.render_full(call.conv, remember=False))
            except ProviderError:  # the template refuses the whole conversation, though not its new turns
                call.flags.append(f"{HISTORY_DIFFERS}:unrenderable")
            else:
                if differ:
                    call.flags.append(f"{HISTORY_DIFFERS}:{differ}")
        dropped = model.dropped_by_template(call.conv)
        call.flags.extend(dropped)
        call.flags.extend(overridden)  # the trainer's sampling, not the request's (polar_mitm/sessions/sampling.py)
        if dropped and key not in self._warned:
            if len(self._warned) > 10_000:
                self._warned.clear()
            self._warned.add(key)
            log.warning("polar: session %s/%s: the chat template of %s drops %s; the model cannot see them",
                        *key, options.tokenizer, ", ".join(dropped))

    def _build_for_engine(self, call: calls.Call) -> None:
        """The engine's chat request: it renders the conversation and parses its reply (engines/chat.py)."""
        check_fits(self.model, call.conv)
        sampling, overridden = apply_fixed(call.conv.sampling, call.session.sampling)
        call.prompt = None  # the engine's, once it answers
        call.engine_request = chat_request(call.conv, sampling, sampling.max_tokens or self.options.max_tokens,
                                           call.conv.stream, self.options.engine_model)
        call.raw_body = b""
        call.detok, call.parser = None, EngineReply(call.call_id.replace("call-", "call_") + "_")
        call.flags.extend(overridden)

    async def complete(self, call: calls.Call) -> http.Response:
        """The provider's reply to a non-streamed call, recorded before it is returned."""
        async def send(replica: Replica) -> tuple[int, bytes]:
            replica.inflight += 1
            try:
                return await replica.client.complete(*call.engine_request)  # rebuilt by a fail_over
            finally:
                replica.inflight -= 1

        replica, (status, raw) = await self.on_replica(call, send)
        data = engine_json(raw)
        if status != 200:
            replica.served += 1
            raise engine_refused(status, data)
        self.engines.pool.answered(replica)
        try:
            if calls.rendered_by_engine(call):
                calls.take_chat(call, data)
                if call.prompt is None:
                    raise EngineError(NO_PROMPT_IDS)
            else:
                apply_chunk(self.options.engine, data, call.output)
                calls.feed_ids(call, call.output.output_ids, self.model.stop_ids)
        except EngineError as e:
            raise ProviderError(502, f"polar: {e}", "api_error") from e
        calls.finish_events(call)
        completion = calls.completion_of(call, self.model.stop_ids)
        codec = CODECS[call.route.api]
        body = codec.render_response(completion, **codec.encoder_options(call.request_body))
        await self.settle(call, completion, body, None)
        return json_response(200, body)

    def finish(self, call: calls.Call, completion, body: dict | None, error: str | None) -> None:
        """Record the call, then (only once it is on disk) remember it in the session history, before the reply
        goes out, so the harness's next request can already extend it. Raises CaptureError."""
        if self.record(call, calls.make_record(call, body, error=error, flags=self._flags(call))) and error is None:
            self._remember(call, completion)

    async def settle(self, call: calls.Call, completion, body: dict | None, error: str | None) -> None:
        """`finish` without blocking the loop: the record goes into the capture writer's next batch, and the
        reply waits until it is durable. Raises CaptureError."""
        if call.recorded:
            return
        record = calls.make_record(call, body, error=error, flags=self._flags(call))
        call.recorded = True  # the claim (see `record`); kept if this await is cancelled, the write goes on
        try:
            await self.capture.commit(record, _extends(call))
        except Exception:  # nothing on disk (a cancellation is not an Exception: the claim stands)
            call.recorded = False
            raise
        if error is None:
            self._remember(call, completion)

    @staticmethod
    def _flags(call: calls.Call) -> tuple[str, ...]:
        return tuple(call.flags) + (call.parser.result().flags if call.parser else ())

    def _remember(self, call: calls.Call, completion) -> None:
        if calls.rendered_by_engine(call):  # the engine renders each call in full: no history to substitute
            return
        key = (call.session.task_id, call.session.session_id)
        history = self.histories.peek(key)
        if history is not None and history.engine == call.engine:  # not a session that moved meanwhile
            history.remember(call.prompt, calls.reply_message(completion), calls.call_tokens(call, self.model.stop_ids))
            self.histories.reweigh(key)  # past polar_memory_budget, the least recently used sessions go

    def memory_figures(self) -> dict[str, int]:
        """What the proxy holds for its sessions and prompts (the status log line and the status file)."""
        h = self.histories
        figures = {"histories": len(h), "history_bytes": h.weight, "history_budget_bytes": h.max_weight,
                   "evicted": h.evictions}
        if self.model is not None:
            figures["prefix_cache_prefixes"], figures["prefix_cache_ids"] = self.model.renderer.prefixes.size
        return figures

    def memory_line(self) -> str:
        """What the proxy holds for its sessions and prompts, for the status log."""
        f = self.memory_figures()
        line = f"{f['histories']} session histories, {f['history_bytes'] / 2**20:.1f} MB"
        if f["history_budget_bytes"]:
            line += f" of {f['history_budget_bytes'] / 2**20:.0f} MB (polar_memory_budget)"
        line += f", {f['evicted']} evicted"
        if "prefix_cache_ids" in f:
            line += f"; shared-prefix cache {f['prefix_cache_prefixes']} prefixes, {f['prefix_cache_ids']} ids"
        return line

    def fail(self, call: calls.Call, e: ProviderError) -> http.Response:
        """The provider's error for a call, recorded when it was an LLM call."""
        if e.status >= 500 or e.status == 413:
            log.error("polar: call %s: %s", call.call_id, e.message)
        if call.route.kind == "generate" and not call.recorded:
            try:
                self.record(call, calls.make_record(call, None, error=e.message, flags=tuple(call.flags)))
            except CaptureError as ce:
                return error_response(call.route.api, 500, f"polar: {ce}")
        return error_response(call.route.api, e.status, e.message, e.kind)

    async def fail_async(self, call: calls.Call, e: ProviderError) -> http.Response:
        """`fail` without blocking the event loop while the record is written (the loop serves other calls)."""
        if e.status >= 500 or e.status == 413:
            log.error("polar: call %s: %s", call.call_id, e.message)
        if call.route.kind == "generate" and not call.recorded:
            call.recorded = True  # the claim (see `record`)
            try:
                await self.capture.commit(calls.make_record(call, None, error=e.message, flags=tuple(call.flags)),
                                          _extends(call))
            except Exception as ce:
                call.recorded = False
                if not isinstance(ce, CaptureError):
                    raise
                return error_response(call.route.api, 500, f"polar: {ce}")
        return error_response(call.route.api, e.status, e.message, e.kind)

    # A call has one record. The first writer claims it before writing, so a disconnect noticed meanwhile (the
    # error hook, the relay finishing the stream) cannot add a second line with the same call_id, which readers
    # refuse.
    def record(self, call: calls.Call, record) -> bool:
        """Write the call's record; False when it already has one (that one stands)."""
        if call.recorded:
            return False
        call.recorded = True
        try:
            self.capture.write(record, _extends(call))
        except Exception:
            call.recorded = False  # nothing on disk: an error record may still be tried
            raise
        return True


def _extends(call: calls.Call) -> int:
    """How many leading prompt ids are the parent call's prompt + output (the capture writer then checks
    only the seam), 0 for a prompt rendered in full."""
    return call.prompt.extends if call.prompt is not None and call.prompt.parent_call_id else 0
