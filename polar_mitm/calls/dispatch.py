"""A call's engine side, for its owner (calls/owner.py): its replica (placement, a retry on another replica when
one fails before answering, and the replica's bookkeeping: calls in flight, answered, refused, marked down), its
prompt and engine request, the engine's answer (whole, or as a stream), and the session history it extends. It
writes the call's engine fields (engine, prompt, engine request, decoder, flags)."""
from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from typing import Any, AsyncIterator, Awaitable, Callable, TypeVar

import aiohttp
from mitmproxy import ctx
from mitmproxy.exceptions import OptionsError

from polar_mitm.calls import call as calls
from polar_mitm.conversation import ProviderError, ReplyEvent
from polar_mitm.engines.api import apply_chunk, engine_request, parse_engine
from polar_mitm.engines.chat import ENGINE_SOURCE, RENDERS, EngineReply, apply_chat, chat_request
from polar_mitm.engines.client import EngineFailure, chunks, engine_json, engine_refused
from polar_mitm.engines.replicas import Engines, Replica
from polar_mitm.sessions.cache import SessionCache
from polar_mitm.sessions.sampling import apply_fixed
from polar_mitm.tokens.model import Model, load_model
from polar_mitm.tokens.prompt import Prompt, SessionHistory, template_difference

log = logging.getLogger(__name__)
T = TypeVar("T")
# A call with a body this large is parsed, rendered, tokenized and recorded on a small thread pool, not on the
# event loop that serves every other session's calls (the tokenizer and file writes release the GIL; a JSON
# parse of many small objects does not, and stays the one cost a large body puts on the loop).
OFF_LOOP_BYTES = 1 * 2**20
OFF_LOOP_THREADS = 2


@dataclass(frozen=True)
class CallOptions:
    """What each call reads of the proxy's options, parsed once by Dispatcher.configure."""

    engine: str = "sglang"  # the token API (polar_engine)
    max_tokens: int = 2048  # when a request sets none (polar_max_tokens)
    engine_model: str | None = None  # the model name a vLLM backend is sent (polar_engine_model)
    tokenizer: str = ""  # the model directory, named in warnings (polar_tokenizer)
    history_check: str = "sampled"  # compare substituted prompts with the template's rendering (polar_history_check)
    render: str = "proxy"  # proxy: our template and parsers; engine: the engine's chat API (polar_render)


HISTORY_CHECKS = ("sampled", "all", "off")
MODEL_OPTIONS = frozenset({"polar_tokenizer", "polar_tool_parser", "polar_reasoning_parser", "polar_context_length",
                           "polar_render"})


def parse_positive(value: int) -> int:
    if value <= 0:
        raise ValueError(f"expected a positive number, got {value}")
    return value


def parse_one_of(choices: tuple[str, ...]) -> Callable[[str], str]:
    def parse(value: str) -> str:
        if value not in choices:
            raise ValueError(f"expected one of {', '.join(choices)}, got {value!r}")
        return value
    return parse


# option -> (parse, CallOptions field)
OPTIONS: dict[str, tuple[Callable[[Any], Any], str]] = {
    "polar_engine": (parse_engine, "engine"),
    "polar_max_tokens": (parse_positive, "max_tokens"),
    "polar_engine_model": (lambda value: value or None, "engine_model"),
    "polar_tokenizer": (str, "tokenizer"),
    "polar_history_check": (parse_one_of(HISTORY_CHECKS), "history_check"),
    "polar_render": (parse_one_of(RENDERS), "render"),
}
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
    def __init__(self, engines: Engines, histories: SessionCache[tuple[str, str], SessionHistory]) -> None:
        self.engines, self.histories = engines, histories
        self.options = CallOptions()
        self.model: Model | None = None
        self._warned: set[tuple[str, str]] = set()
        self._pool = ThreadPoolExecutor(OFF_LOOP_THREADS, thread_name_prefix="polar-large-call")
        self.formats = ""  # who renders and parses, and how: said at start (logged here, printed by polar proxy)

    def load(self, loader) -> None:
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
        loader.add_option("polar_render", str, "proxy",
                          "Who renders prompts and parses replies: proxy (the model's chat template here, history "
                          "substituted, token-exact) or engine (the engine's chat API with token ids: any model the "
                          "engine supports; each call rendered in full, prefix_source rendered:engine).")
        loader.add_option("polar_history_check", str, "sampled",
                          "Compare substituted prompts with the chat template's own rendering and flag the "
                          "difference: sampled (a session's 1st, 2nd, 4th, 8th... substituted call), all, off.")

    def configure(self, updated) -> None:
        opts = ctx.options
        for name, (parse, attr) in OPTIONS.items():
            if name in updated:
                try:
                    self.options = replace(self.options, **{attr: parse(getattr(opts, name))})
                except ValueError as e:
                    raise OptionsError(f"{name}: {e}") from e
        if MODEL_OPTIONS & set(updated) and opts.polar_tokenizer:
            engine_renders = opts.polar_render == "engine"  # its template and parsers: none of ours to pick
            try:
                self.model = load_model(opts.polar_tokenizer, "none" if engine_renders else opts.polar_tool_parser,
                                        "none" if engine_renders else opts.polar_reasoning_parser,
                                        opts.polar_context_length)
            except ValueError as e:
                raise OptionsError(f"polar_tokenizer: {e}") from e
            model = self.model
            self.formats = ("the engine renders prompts and parses replies (--render engine)" if engine_renders else
                            f"tool calls {model.tool_parser or 'none'}, reasoning {model.reasoning_parser or 'none'} "
                            f"({model.family})")
            log.info("polar: model %s: %s", model.served_names[0], self.formats)

    def check(self) -> None:
        """Once running: a proxy without a model cannot serve a call."""
        if self.model is None:
            raise OptionsError("polar_tokenizer: set it to the model directory (tokenizer + chat template)")

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

    async def complete(self, call: calls.Call) -> Any:
        """The engine's whole answer to a non-streamed call (its JSON). Raises ProviderError."""
        async with self._on_replica(call, lambda r: r.client.complete(*call.engine_request)) as (replica, answer):
            status, raw = answer
            data = engine_json(raw)
            self._answered(replica, status, data)
            return data

    @asynccontextmanager
    async def stream(self, call: calls.Call) -> AsyncIterator[AsyncIterator[bytes]]:
        """The engine's stream for a streamed call, its headers received: the block reads its chunks. Raises
        ProviderError on entering; the chunks raise it when the engine stalls or breaks off mid-stream."""
        async with self._on_replica(call, lambda r: r.client.open_stream(*call.engine_request)) as (replica, upstream):
            async with upstream:
                self._answered(replica, upstream.status, engine_json(await upstream.read()) if upstream.status != 200
                               else None)
                yield self._chunks(replica, upstream)

    def take_answer(self, call: calls.Call, data: dict[str, Any]) -> list[ReplyEvent]:
        """One answer of the engine (whole, or a streamed chunk) into the call: its output ids and logprobs and
        its reply's events; for an engine-rendered call also its prompt, the engine's own rendering."""
        if calls.rendered_by_engine(call):
            prompt_ids, events = apply_chat(data, call.output, call.parser)
            if prompt_ids is not None and call.prompt is None:
                call.prompt = Prompt(prompt_ids, ENGINE_SOURCE, None, [])
            return events
        have = len(call.output.output_ids)
        apply_chunk(self.options.engine, data, call.output)
        return calls.feed_ids(call, call.output.output_ids[have:], self.model.stop_ids)

    @asynccontextmanager
    async def _on_replica(self, call: calls.Call, send: Callable[[Replica], Awaitable[T]]
                          ) -> AsyncIterator[tuple[Replica, T]]:
        """`send(replica)` on the call's replica, again on another one when a replica fails before answering
        (fail_over); the replica counts the call in flight until the block ends. Raises ProviderError when none
        answers."""
        replica, tried = self.engines.pool.get(call.engine), set()
        while True:
            replica.inflight += 1
            try:
                answer = await send(replica)
                break
            except EngineFailure as e:
                replica.inflight -= 1
                replica = await self.fail_over(call, replica, e, tried)
            except BaseException:
                replica.inflight -= 1
                raise
        try:
            yield replica, answer
        finally:
            replica.inflight -= 1

    def _answered(self, replica: Replica, status: int, data: Any) -> None:
        """The replica answered the call: serving, when it said 200; else the provider's error (ProviderError)."""
        if status != 200:
            replica.served += 1
            raise engine_refused(status, data)
        self.engines.pool.answered(replica)

    async def _chunks(self, replica: Replica, upstream: aiohttp.ClientResponse) -> AsyncIterator[bytes]:
        try:
            async for chunk in chunks(upstream, replica.client.timeouts):
                yield chunk
        except EngineFailure as e:  # it stalled or broke off: its replica is marked down (the call is not retried)
            self.engines.pool.mark_down(replica, e.message.removeprefix("polar: "))
            raise

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
        check_fits(model, call.conv)
        history = self.histories.get(key)
        prompt = history.build_prompt(call.conv, model.renderer)
        room = model.context_length - len(prompt.ids)
        if room <= 0:  # the record keeps no prompt ids: nothing was sampled from them
            raise ProviderError(400, f"prompt is {len(prompt.ids)} tokens; the model's context is "
                                     f"{model.context_length} tokens", "context_length_exceeded")
        call.prompt = prompt
        sampling, overridden = apply_fixed(call.conv.sampling, call.session.sampling)
        max_new = min(sampling.max_tokens or options.max_tokens, room)
        call.engine_request = engine_request(options.engine, call.prompt.ids, sampling, max_new,
                                             call.conv.stream, options.engine_model)
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
        call.detok, call.parser = None, EngineReply(call.call_id.replace("call-", "call_") + "_")
        call.flags.extend(overridden)

    def remember(self, call: calls.Call, completion) -> None:
        """A recorded call, now the session history's last turn (its next prompt extends it)."""
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
