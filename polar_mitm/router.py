"""The proxy's options for the engine side of a call (its engines, the model and its formats, the session
histories, the status file), and its start and stop. A call itself is served by its owner (calls/owner.py)."""
from __future__ import annotations

import asyncio
import logging
from dataclasses import replace
from pathlib import Path
from typing import Any

from mitmproxy import ctx
from mitmproxy.exceptions import OptionsError

from polar_mitm.calls.dispatch import HISTORY_CHECKS, Dispatcher
from polar_mitm.calls.owner import CallOwner
from polar_mitm.capture import MAX_BYTES as CAPTURE_MAX_BYTES
from polar_mitm.capture import Capture
from polar_mitm.engines.api import parse_engine
from polar_mitm.engines.backends import parse_backends, parse_placement
from polar_mitm.engines.chat import RENDERS
from polar_mitm.engines.client import Timeouts
from polar_mitm.engines.replicas import Engines
from polar_mitm.gate.fence import Fence
from polar_mitm.gate.quotas import SessionQuotas
from polar_mitm.sessions.cache import SessionCache
from polar_mitm.sessions.registry import redis_url_of, watch_ended
from polar_mitm.status_file import INTERVAL_S as STATUS_INTERVAL_S
from polar_mitm.status_file import write_status
from polar_mitm.tokens.model import load_model
from polar_mitm.tokens.prefix_cache import BYTES_PER_ID as CACHE_BYTES_PER_ID
from polar_mitm.tokens.prefix_cache import MAX_IDS
from polar_mitm.tokens.prompt import SessionHistory

log = logging.getLogger(__name__)


def parse_positive(value: int) -> int:
    if value <= 0:
        raise ValueError(f"expected a positive number, got {value}")
    return value


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
        self.dispatch = Dispatcher(self.engines, self.histories)
        self.calls = CallOwner(capture, quotas, fence, self.dispatch)
        self.relay = self.calls.relay
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
        self.calls.capture.forget(task_id, session_id)

    async def done(self) -> None:
        for task in (self._ended_watch, self._status_task):
            if task is not None:
                task.cancel()
        if self._status_path is not None:
            self._status_path.unlink(missing_ok=True)  # stopped, not stale
        await self.relay.stop()
        await self.engines.stop()
        self.dispatch.close()
