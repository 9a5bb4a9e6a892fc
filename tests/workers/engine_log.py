"""The engine's request log: a pass-through HTTP server in front of the reference server that records when each
request reached the engine and when its answer ended (the reference server keeps no request log of its own).
Streams are passed through as they come. Used by the fence test: no generation request may start during a pause."""
from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field

from aiohttp import ClientSession, ClientTimeout, web


@dataclass
class EngineLog:
    upstream: str
    entries: list[dict] = field(default_factory=list)
    url: str = ""

    def generations(self) -> list[dict]:
        return [e for e in self.entries if e["path"] in ("/generate", "/v1/completions")]


async def _forward(log: EngineLog, session: ClientSession, request: web.Request) -> web.StreamResponse:
    entry = {"path": request.path, "start": time.time(), "end": None}
    log.entries.append(entry)
    body = await request.read()
    headers = {k: v for k, v in request.headers.items() if k.lower() not in ("host", "content-length")}
    async with session.request(request.method, log.upstream + request.path_qs, data=body, headers=headers) as up:
        out = web.StreamResponse(status=up.status, headers={k: v for k, v in up.headers.items()
                                                            if k.lower() not in ("content-length", "transfer-encoding",
                                                                                 "content-encoding")})
        await out.prepare(request)
        async for chunk in up.content.iter_any():
            await out.write(chunk)
        await out.write_eof()
    entry["end"] = time.time()
    return out


def start_engine_log(upstream: str) -> tuple[EngineLog, callable]:
    """Serve on 127.0.0.1 and a free port in a thread; returns the log and a stop function."""
    log = EngineLog(upstream.rstrip("/"))
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    state: dict = {}

    async def main() -> None:
        session = ClientSession(timeout=ClientTimeout(total=None))
        app = web.Application(client_max_size=256 * 1024 * 1024)
        async def handle(request: web.Request) -> web.StreamResponse:
            return await _forward(log, session, request)

        app.router.add_route("*", "/{tail:.*}", handle)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        log.url = f"http://127.0.0.1:{port}"
        state.update(runner=runner, session=session)
        ready.set()

    thread = threading.Thread(target=lambda: (loop.run_until_complete(main()), loop.run_forever()), daemon=True)
    thread.start()
    ready.wait(30)

    def stop() -> None:
        async def close() -> None:
            await state["runner"].cleanup()
            await state["session"].close()
        asyncio.run_coroutine_threadsafe(close(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(30)

    return log, stop
