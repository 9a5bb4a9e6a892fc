"""HTTP front of the reference server (aiohttp). All model work runs on one worker thread, one step at a time, so
concurrent requests interleave token by token and each keeps its own KV cache. Listens where it is told
(127.0.0.1 by default) and reaches nothing else."""
from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, AsyncIterator, Awaitable, Callable, TypeVar

from aiohttp import web

from polar_serve import api_chat, api_sglang, api_vllm
from polar_serve.engine import Engine
from polar_serve.params import BadRequest, as_object, check_prompt
from polar_serve.policy import Policy
from polar_serve.prompt_view import parse_prompt
from polar_serve.sampling import SamplingParams
from polar_serve.sequence import Sequence

log = logging.getLogger("polar_serve")
T = TypeVar("T")
SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}


@dataclass(frozen=True)
class ServerOptions:
    served_model_name: str
    incremental_streaming_output: bool = False  # SGLang's flag: stream deltas instead of cumulative chunks
    step_delay_s: float = 0.0  # a scripted pause after every produced token (benchmarks, load-balancing tests)
    reply_format: str = "hermes"  # how a policy's replies write reasoning and tool calls (reply_formats.py)


class Worker:
    """The one thread that touches the model."""

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="polar-engine")

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


class Gate:
    """Admission of new requests: pause() closes it and waits for in-flight requests to finish."""

    def __init__(self) -> None:
        self._open = asyncio.Event()
        self._open.set()
        self._idle = asyncio.Event()
        self._idle.set()
        self.active = 0
        self.held = 0  # requests waiting for the gate to reopen

    @property
    def paused(self) -> bool:
        return not self._open.is_set()

    @asynccontextmanager
    async def admit(self) -> AsyncIterator[None]:
        self.held += 1
        try:
            while not self._open.is_set():
                await self._open.wait()
        finally:
            self.held -= 1
        self.active += 1
        self._idle.clear()
        try:
            yield
        finally:
            self.active -= 1
            if self.active == 0:
                self._idle.set()

    async def close_and_drain(self) -> None:
        self._open.clear()
        await self._idle.wait()

    def reopen(self) -> None:
        self._open.set()


def error_body(message: str, kind: str, status: int) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "code": status}}


def weights_failed(message: str) -> web.Response:
    """SGLang answers a failed weight update with success=false; we add the usual error object."""
    body = {"success": False, "message": message, **error_body(message, "invalid_request_error", 400)}
    return web.json_response(body, status=400)


@web.middleware
async def errors(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                 ) -> web.StreamResponse:
    try:
        return await handler(request)
    except BadRequest as e:
        return web.json_response(error_body(e.message, e.kind, e.status), status=e.status)
    except web.HTTPException as e:
        if e.status < 400:
            raise
        return web.json_response(error_body(e.reason, "not_found" if e.status == 404 else "http_error", e.status),
                                 status=e.status)
    except Exception as e:  # noqa: BLE001 — a bug must answer 500, not kill the server
        log.exception("request failed: %s %s", request.method, request.path)
        return web.json_response(error_body(f"{type(e).__name__}: {e}", "server_error", 500), status=500)


async def read_json(request: web.Request) -> Any:
    try:
        return json.loads(await request.read() or b"null")
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise BadRequest(f"request body is not valid JSON: {e}") from e


def sse(data: Any) -> bytes:
    return b"data: " + json.dumps(data, ensure_ascii=False).encode() + b"\n\n"


class ReferenceServer:
    def __init__(self, engine: Engine, policy: Policy | None, options: ServerOptions) -> None:
        self.engine = engine
        self.policy = policy
        self.options = options
        self.worker = Worker()
        self.gate = Gate()
        self.admin_lock = asyncio.Lock()
        self.counts = {"requests": 0, "prompt_tokens": 0, "cached_tokens": 0}  # since start, for GET /metrics

    def app(self) -> web.Application:
        app = web.Application(middlewares=[errors], client_max_size=64 * 1024 * 1024)
        app.add_routes([
            web.get("/health", self.health), web.get("/health_generate", self.health),
            web.get("/get_model_info", self.model_info), web.get("/v1/models", self.models),
            web.get("/metrics", self.metrics),
            web.post("/generate", self.generate), web.post("/v1/completions", self.completions),
            web.post("/v1/chat/completions", self.chat),
            web.post("/update_weights_from_disk", self.update_weights),
            web.post("/pause_generation", self.pause), web.post("/resume_generation", self.resume),
            web.post("/flush_cache", self.flush_cache),
        ])
        app.on_cleanup.append(self._close)
        return app

    async def _close(self, _app: web.Application) -> None:
        self.worker.close()

    # -- sequences ------------------------------------------------------------------------------------------
    def new_sequence(self, prompt_ids: list[int], params: SamplingParams) -> Sequence:
        e = self.engine
        try:
            params.validate(e.vocab_size)
        except ValueError as err:
            raise BadRequest(str(err)) from err
        check_prompt(prompt_ids, params.max_new_tokens, e.vocab_size, e.max_context_length)
        match = None
        if self.policy is not None:
            match = self.policy.reply_for(parse_prompt(e.decode(prompt_ids, skip_special_tokens=False)), params.seed,
                                          self.options.reply_format)
        if match is None:
            return Sequence(e, prompt_ids, params)
        forced = e.encode(match.text) + [e.tokenizer.eos_token_id]
        seq = Sequence(e, prompt_ids, params, forced_ids=forced[: e.max_context_length - len(prompt_ids)])
        seq.policy_rule, seq.scripted = match.name, match
        return seq

    async def drive(self, seq: Sequence, on_step: Callable[[Sequence], Awaitable[None]] | None = None) -> None:
        """Run the sequence to the end, one worker job per token; on_step sees it after every token."""
        async with self.gate.admit():
            await self.worker.run(seq.start)
            self.counts["requests"] += 1
            self.counts["prompt_tokens"] += len(seq.prompt_ids)
            self.counts["cached_tokens"] += seq.cached_tokens
            while not seq.finished:
                await self.worker.run(seq.step)
                if on_step is not None:
                    await on_step(seq)
                if self.options.step_delay_s > 0:  # on the event loop: other requests run meanwhile
                    await asyncio.sleep(self.options.step_delay_s)

    async def stream(self, request: web.Request, seq: Sequence, chunk: Callable[[Sequence], list[Any]]
                     ) -> web.StreamResponse:
        response = web.StreamResponse(headers=SSE_HEADERS)
        await response.prepare(request)

        async def send(s: Sequence) -> None:
            for data in chunk(s):
                await response.write(sse(data))

        try:
            await self.drive(seq, send)
            if not seq.out.ids:
                await send(seq)  # max_new_tokens = 0: still one chunk with the finish reason
        except ConnectionError:  # the client went away: the sequence is dropped, the gate already released it
            log.info("client closed the stream after %d tokens", len(seq.out.ids))
            return response
        except Exception as e:  # noqa: BLE001 — headers are sent: report in-band, then end the stream
            log.exception("stream failed")
            await response.write(sse(error_body(f"{type(e).__name__}: {e}", "server_error", 500)))
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    # -- token APIs -----------------------------------------------------------------------------------------
    async def generate(self, request: web.Request) -> web.StreamResponse:
        req = api_sglang.parse_request(await read_json(request))
        prompt_ids = req.input_ids if req.input_ids is not None else self.engine.encode(req.text or "")
        seq = self.new_sequence(prompt_ids, req.params)
        rid, t0 = uuid.uuid4().hex, time.monotonic()
        if not req.stream:
            await self.drive(seq)
            return web.json_response(api_sglang.render(seq, req, rid, time.monotonic() - t0))
        cursor = api_sglang.Cursor() if self.options.incremental_streaming_output else None
        return await self.stream(request, seq,
                                 lambda s: [api_sglang.render(s, req, rid, time.monotonic() - t0, cursor)])

    async def completions(self, request: web.Request) -> web.StreamResponse:
        req = api_vllm.parse_request(await read_json(request))
        prompt_ids = req.prompt_ids if req.prompt_ids is not None else self.engine.encode(req.prompt_text or "")
        seq = self.new_sequence(prompt_ids, req.params)
        renderer = api_vllm.Renderer(req, self.options.served_model_name)
        if not req.stream:
            await self.drive(seq)
            return web.json_response(renderer.response(seq))
        cursor = api_vllm.Cursor()

        def chunks(s: Sequence) -> list[Any]:
            out = [renderer.chunk(s, cursor)]
            if s.finished and req.include_usage:
                out.append(renderer.usage_chunk(s))
            return out

        return await self.stream(request, seq, chunks)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        """vLLM's chat endpoint with token ids (polar_serve/api_chat.py): the model's template renders."""
        req = api_chat.parse_request(await read_json(request))
        seq = self.new_sequence(api_chat.prompt_ids(self.engine.tokenizer, req), req.params)
        renderer = api_chat.Renderer(req, self.options.served_model_name)
        if not req.stream:
            await self.drive(seq)
            return web.json_response(renderer.response(seq))

        def chunks(s: Sequence) -> list[Any]:
            out = [renderer.chunk(s)]
            if s.finished and req.include_usage:
                out.append(renderer.usage_chunk(s))
            return out

        return await self.stream(request, seq, chunks)

    # -- control --------------------------------------------------------------------------------------------
    async def health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "weight_version": self.engine.weight_version})

    async def metrics(self, request: web.Request) -> web.Response:
        """Prometheus text: requests started, prompt tokens, and those served from the prefix cache."""
        lines = []
        for name, value in self.counts.items():
            lines += [f"# TYPE polar_serve_{name}_total counter", f"polar_serve_{name}_total {value}"]
        return web.Response(text="\n".join(lines) + "\n", content_type="text/plain")

    async def model_info(self, request: web.Request) -> web.Response:
        info = self.engine.info()
        return web.json_response({
            "model_path": info.model_path, "tokenizer_path": info.model_path, "is_generation": True,
            "served_model_name": self.options.served_model_name, "weight_version": info.weight_version,
            "vocab_size": info.vocab_size, "eos_token_ids": list(info.eos_token_ids),
            "max_context_length": info.max_context_length, "paused": self.gate.paused,
            "held_requests": self.gate.held,
        })

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{
            "id": self.options.served_model_name, "object": "model", "owned_by": "polar",
            "max_model_len": self.engine.max_context_length}]})

    async def update_weights(self, request: web.Request) -> web.Response:
        body = as_object(await read_json(request))
        path, version = body.get("model_path"), body.get("weight_version")
        if version is not None and not isinstance(version, (str, int)):
            raise BadRequest("`weight_version` must be a string or an integer")
        if not isinstance(path, str) or not Path(path).is_dir():
            return weights_failed(f"`model_path` must name a model directory on this machine, got {path!r}")
        async with self.admin_lock:
            was_paused = self.gate.paused
            await self.gate.close_and_drain()  # in-flight requests finish on the old weights
            try:
                new_version = await self.worker.run(self.engine.load_weights, path,
                                                    None if version is None else str(version))
            except Exception as e:  # noqa: BLE001 — a bad checkpoint is the caller's error; keep serving
                return weights_failed(f"failed to load {path}: {type(e).__name__}: {e}")
            finally:
                if not was_paused:
                    self.gate.reopen()
        log.info("weights loaded from %s, weight_version=%s", path, new_version)
        return web.json_response({"success": True, "message": f"loaded {path}", "weight_version": new_version,
                                  "num_paused_requests": 0})

    async def pause(self, request: web.Request) -> web.Response:
        async with self.admin_lock:
            await self.gate.close_and_drain()
        return web.json_response({"success": True, "paused": True})

    async def resume(self, request: web.Request) -> web.Response:
        self.gate.reopen()
        return web.json_response({"success": True, "paused": False})

    async def flush_cache(self, request: web.Request) -> web.Response:
        flushed = await self.worker.run(self.engine.flush_prefix_cache, "POST /flush_cache")
        return web.json_response({
            "success": True, "flushed_entries": flushed.entries, "flushed_tokens": flushed.tokens,
            "message": f"flushed the prefix cache: {flushed.entries} entries, {flushed.tokens} tokens"})
