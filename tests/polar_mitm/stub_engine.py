"""A zero-compute stand-in for an SGLang engine, written for the proxy's failure and memory tests: it answers
`/generate` at once with fixed token ids, or misbehaves on purpose (`mode`): `hang` accepts and never
answers, `die` streams two tokens and then drops the connection. `/health` answers `health` (200; a 503 plays an
engine reloading its weights). Runs on 127.0.0.1 (port 0: any free one) in a background thread."""
from __future__ import annotations

import asyncio
import json
import threading

from aiohttp import web


class StubEngine:
    def __init__(self, ids: list[int], port: int = 0) -> None:
        self.ids, self.mode, self.requests, self.health, self.port = ids, "ok", 0, 200, port
        self.bodies: list[dict] = []  # every /generate body received, in order
        self.url = ""
        self._ready = threading.Event()
        self._loop = asyncio.new_event_loop()
        threading.Thread(target=self._run, daemon=True).start()
        self._ready.wait(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        app = web.Application()
        app.router.add_post("/generate", self._generate)
        app.router.add_get("/health", self._health)
        runner = web.AppRunner(app, access_log=None)
        self._loop.run_until_complete(runner.setup())
        site = web.TCPSite(runner, "127.0.0.1", self.port)
        self._loop.run_until_complete(site.start())
        self.url = "http://127.0.0.1:%d" % site._server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(status=self.health)

    def _meta(self, ids: list[int], done: bool) -> dict:
        return {"text": "", "output_ids": ids, "meta_info": {
            "completion_tokens": len(ids), "finish_reason": {"type": "stop"} if done else None,
            "output_token_logprobs": [[-0.25, t, None] for t in ids]}}

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        self.requests += 1
        body = await request.json()
        self.bodies.append(body)
        if self.mode == "hang":
            await asyncio.sleep(3600)
        if not body.get("stream"):
            return web.json_response(self._meta(self.ids, True))
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        for n in range(1, len(self.ids) + 1):
            if self.mode == "die" and n == 3:
                request.transport.close()  # the engine process dies mid-stream
                return response
            chunk = self._meta(self.ids[:n], n == len(self.ids))
            await response.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        await response.write(b"data: [DONE]\n\n")
        return response
