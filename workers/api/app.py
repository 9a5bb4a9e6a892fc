"""The routes of `polar api` (docs/api.md). Every route but /health needs the bearer token (`Authorization:
Bearer <POLAR_API_TOKEN>`; a browser may open the dashboard page as `/?token=` once, which sets a cookie for the
dashboard's own requests); a token of any bytes that is not the token is a 401; bodies over `max_body` bytes are
refused with 413 before they are read whole. The access log never shows a query string (it may hold the token)."""
from __future__ import annotations

import hmac
import logging
import re
import socket
import time
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, AsyncIterator
from urllib.parse import unquote_to_bytes

import redis
from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, PlainTextResponse, StreamingResponse
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException

from workers import events
from workers.api import metrics
from workers.api.callbacks import Finisher, RetryPolicy
from workers.api.models import BadRequest, PolicyPause, ShortTask, TaskRequest, from_short, from_task_request
from workers.api.service import ApiConfig, NotFound, Service, file_chunks, printable
from workers.api.streams import Hub, Subscriber, sse
from workers.settings import sessions_url

STATIC = Path(__file__).parent / "static"
OPEN_PATHS = ("/health",)
TOKEN_QUERY_PATHS = ("/",)  # only the dashboard page takes ?token= (a browser's first visit), no API route
COOKIE = b"polar_token"


class Json(JSONResponse):
    """JSON that always encodes: a string with a lone surrogate (an agent's file name that is not UTF-8, read
    back from a result) goes out with that byte as a printable backslash escape instead of failing the answer."""

    def render(self, content: Any) -> bytes:
        try:
            return super().render(content)
        except UnicodeEncodeError:
            return super().render(printable(content))


def _json_error(status: int, message: str, headers: dict[str, str] | None = None, **extra: Any) -> JSONResponse:
    return Json({"error": message, **extra}, status_code=status, headers=headers)


class RedactQuery(logging.Filter):
    """uvicorn's access log line without the query string (`?token=` would put the secret in the log)."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and len(args) >= 3 and isinstance(args[2], str) and "?" in args[2]:
            record.args = (*args[:2], args[2].split("?", 1)[0] + "?<redacted>", *args[3:])
        return True


def _redact_access_log() -> None:
    access = logging.getLogger("uvicorn.access")
    if not any(isinstance(f, RedactQuery) for f in access.filters):
        access.addFilter(RedactQuery())


def _query_token(query_string: bytes) -> bytes:
    """`token` of a raw query string, percent-decoded to bytes (any bytes: never a decoding error)."""
    for part in query_string.split(b"&"):
        name, _, value = part.partition(b"=")
        if name == b"token":
            return unquote_to_bytes(value.replace(b"+", b" "))
    return b""


class Guard:
    """ASGI middleware: the token, then the body size (Content-Length, or counted as it streams in)."""

    def __init__(self, app: Any, token: str, max_body: int) -> None:
        self.app, self.token, self.max_body = app, token, max_body

    def authorized(self, scope: dict) -> tuple[bool, bool]:
        """(authorized, came as ?token= so set the cookie). Raw bytes throughout: a header, cookie or query of
        any bytes (not ASCII, not UTF-8) is simply not the token."""
        token = self.token.encode()

        def same(given: bytes) -> bool:
            return bool(given) and hmac.compare_digest(given, token)

        headers: dict[bytes, bytes] = {}
        for k, v in scope.get("headers", []):
            headers[k.lower()] = headers[k.lower()] + b"; " + v if k.lower() in headers else v
        given = headers.get(b"authorization", b"")
        if given[:7].lower() == b"bearer " and same(given[7:].strip()):
            return True, False
        for part in headers.get(b"cookie", b"").split(b";"):
            name, _, value = part.strip().partition(b"=")
            if name == COOKIE and same(value):
                return True, False
        if scope["path"] in TOKEN_QUERY_PATHS and same(_query_token(scope.get("query_string", b""))):
            return True, True
        return False, False

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS:
            return await self.app(scope, receive, send)
        ok, set_cookie = self.authorized(scope)
        if not ok:
            answer = _json_error(401, "missing or wrong bearer token (Authorization: Bearer $POLAR_API_TOKEN)")
            answer.headers["www-authenticate"] = "Bearer"
            return await answer(scope, receive, send)
        length = dict(scope.get("headers", [])).get(b"content-length")
        if length is not None and not length.strip().isdigit():
            return await _json_error(400, "content-length: not a number of bytes")(scope, receive, send)
        if length is not None and int(length) > self.max_body:
            return await _json_error(413, f"body of {int(length)} bytes; the limit is {self.max_body}")(
                scope, receive, send)
        seen = 0

        async def counted() -> dict:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.max_body:  # FastAPI passes an HTTPException raised while it reads the body through
                raise HTTPException(413, f"body over the limit of {self.max_body} bytes")
            return message

        async def send_cookie(message: dict) -> None:
            if set_cookie and message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), (
                    b"set-cookie", COOKIE + f"={self.token}; HttpOnly; SameSite=Strict; Path=/".encode())]
            await send(message)

        await self.app(scope, counted, send_cookie)


class JsonBodies:
    """ASGI middleware: every body this API takes is JSON, so one sent without `Content-Type: application/json`
    (`curl -d` says application/x-www-form-urlencoded) is read as JSON too, not refused as "not an object"."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["method"] in ("POST", "PUT", "PATCH"):
            headers = [(k, v) for k, v in scope.get("headers", []) if k.lower() != b"content-type"]
            scope = {**scope, "headers": [*headers, (b"content-type", b"application/json")]}
        await self.app(scope, receive, send)


def create_app(config: ApiConfig, retry: RetryPolicy = RetryPolicy()) -> FastAPI:
    service = Service(config)
    finisher = Finisher(service.r, f"{socket.gethostname()}-{config.port}-{time.time_ns()}", retry,
                        service.callbacks)
    hub: Hub | None = None

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        nonlocal hub
        _redact_access_log()  # here: uvicorn has configured its loggers by now
        finisher.start()
        # Two connections for every /events client of this process, made on the server's own event loop.
        hub = Hub(events.async_client(service.r, single=True), events.async_client(service.r, single=True),
                  service.pulse, config.heartbeat_s, config.max_streams)
        await hub.start()
        app.state.hub = hub
        yield
        finisher.stop()
        await hub.stop()

    # No /docs: Swagger UI loads its scripts from a CDN; the schema is at /openapi.json.
    app = FastAPI(title="Polar rollout service", lifespan=lifespan, docs_url=None, redoc_url=None,
                  default_response_class=Json)
    app.state.service = service
    app.add_middleware(JsonBodies)
    app.add_middleware(Guard, token=config.token, max_body=config.max_body)
    app.mount("/static", StaticFiles(directory=STATIC), name="static")

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        first = errors[0] if errors else {"loc": ["body"], "msg": "invalid"}
        if first.get("type") == "json_invalid":  # loc is ("body", character offset): the body, not a field "34"
            why = (first.get("ctx") or {}).get("error", "JSON decode error")
            return _json_error(422, f"body: not valid JSON ({why} at character {first['loc'][-1]}; truncated?)",
                               field="body")
        name = ".".join(str(p) for p in first["loc"] if p != "body") or "body"
        return _json_error(422, f"{name}: {first['msg']}", field=name,
                           detail=[{"loc": e["loc"], "msg": e["msg"]} for e in errors])

    @app.exception_handler(BadRequest)
    async def bad(_: Request, exc: BadRequest) -> JSONResponse:
        return _json_error(422, str(exc), field=exc.field)

    @app.exception_handler(NotFound)
    async def missing(_: Request, exc: NotFound) -> JSONResponse:
        return _json_error(404, f"no batch {exc.args[0]!r}")

    @app.get("/health")
    def health() -> Any:
        try:
            service.r.ping()
        except redis.RedisError as e:
            return _json_error(503, f"redis: {e}", ok=False)
        return {"ok": True}

    @app.get("/api/node-config")
    def node_config() -> dict[str, Any]:
        """What `python -m polar.gateway` needs to join as a node: the broker, the sessions Redis, the output root."""
        return {"broker": config.broker, "sessions": config.sessions or sessions_url(config.broker),
                "output_root": str(config.out)}

    @app.post("/api/tasks", status_code=201)
    def submit_short(body: ShortTask) -> dict[str, Any]:
        return service.submit(from_short(body, config.tasks_root))

    @app.post("/rollout/task/submit", status_code=201)
    def submit_task_request(body: TaskRequest) -> dict[str, Any]:
        return service.submit(from_task_request(body, config.tasks_root))

    @app.get("/rollout/task/{batch_id}")
    @app.get("/api/batches/{batch_id}")
    def batch_status(batch_id: str) -> dict[str, Any]:
        return service.status(batch_id)

    @app.get("/api/batches/{batch_id}/results")
    def batch_results(batch_id: str) -> list[dict[str, Any]]:
        return service.results(batch_id)

    @app.delete("/rollout/task/{batch_id}")
    @app.post("/api/batches/{batch_id}/cancel")
    def cancel(batch_id: str) -> dict[str, Any]:
        return {"id": batch_id, "cancelled": service.cancel(batch_id)}

    @app.get("/rollout/status")
    def overview() -> dict[str, Any]:
        return service.overview()

    @app.post("/policy/pause")
    def pause(body: PolicyPause | None = None) -> dict[str, Any]:
        try:
            service.pause((body or PolicyPause()).timeout_s)
        except TimeoutError as e:
            return _json_error(504, str(e), paused=True)
        return {"paused": True, "drained": True}

    @app.post("/policy/resume")
    def resume() -> dict[str, Any]:
        service.resume()
        return {"paused": False}

    @app.get("/policy")
    def policy() -> dict[str, Any]:
        return {"paused": service.client.is_paused()}

    @app.get("/api/batches/{batch_id}/trajectories.parquet")
    def trajectories_parquet(batch_id: str) -> StreamingResponse:
        path = service.parquet_file(batch_id)
        return StreamingResponse(file_chunks(path), media_type="application/vnd.apache.parquet",
                                 headers={"content-length": str(path.stat().st_size),
                                          "content-disposition": f'attachment; filename="{batch_id}.parquet"'})

    @app.get("/api/batches/{batch_id}/trajectories")
    def trajectories_json(batch_id: str) -> list[dict[str, Any]]:
        return service.trajectory_rows(batch_id)

    @app.get("/api/batches/{batch_id}/report")
    def report(batch_id: str) -> HTMLResponse:
        """The batch's `polar report` page, drawn now from its folder."""
        from polar.report.cli import render_report

        return HTMLResponse(printable(render_report(service.trajectories_folder(batch_id).parent)))

    @app.get("/metrics")
    def prometheus() -> PlainTextResponse:
        streams = len(hub.subscribers) if hub else 0
        return PlainTextResponse(metrics.render(service.r, service.client.is_paused(), streams=streams),
                                 media_type="text/plain; version=0.0.4")

    @app.get("/events")
    async def event_stream(request: Request, batch: str | None = None, after: str | None = None) -> Response:
        """From the `Last-Event-ID` header (a reconnecting client), else `?after=` (the dashboard's snapshot
        position), else from now."""
        assert hub is not None
        after = request.headers.get("last-event-id") or after or await hub.last_id()
        if not re.fullmatch(r"\d+-\d+", after):
            return _json_error(422, f"after: {after!r} is not a stream id (MILLISECONDS-SEQUENCE)", field="after")
        sub = hub.open()
        if sub is None:
            return _json_error(429, f"{config.max_streams} event streams are open, the most this server takes "
                                    f"(polar api --max-streams); try again later", headers={"retry-after": "5"})
        return EventStream(hub, sub, sse(hub, sub, after, batch))

    @app.get("/")
    def dashboard() -> FileResponse:
        return FileResponse(STATIC / "index.html", headers={"cache-control": "no-store"})

    return app



class EventStream(StreamingResponse):
    """An SSE answer that gives its Hub slot back however it ends (the client gone, cut off, the server
    stopping), even if its body never started."""

    def __init__(self, hub: Hub, sub: Subscriber, body: AsyncIterator[bytes]) -> None:
        super().__init__(body, media_type="text/event-stream",
                         headers={"cache-control": "no-store", "x-accel-buffering": "no"})
        self.hub, self.sub = hub, sub

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.hub.close(self.sub)
