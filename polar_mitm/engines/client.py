"""The proxy's own HTTP client to the inference engine: one pooled keep-alive session, with timeouts that end
in the provider's error shape instead of a hung harness (docs/design.md §5)."""
from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any, AsyncIterator

import aiohttp

from polar_mitm.conversation import ProviderError
from polar_traj.captures import dumps_line, loads_line  # orjson, with the stdlib for what orjson refuses


@dataclass(frozen=True)
class Timeouts:
    total_s: float = 600.0  # a whole call
    first_byte_s: float = 120.0  # streams: until the first byte, and between two chunks


class EngineFailure(ProviderError):
    """The engine did not answer (refused, went away, or too slow): its replica is marked down. `retry`:
    nothing of the call has reached the harness, so it may go to another replica."""

    def __init__(self, status: int, message: str, kind: str, retry: bool) -> None:
        super().__init__(status, message, kind)
        self.retry = retry


def engine_unreachable(url: str, e: BaseException) -> EngineFailure:
    return EngineFailure(503, f"polar: the inference engine at {url} is unreachable ({type(e).__name__}: {e})",
                         "overloaded_error", retry=True)


def engine_timeout(seconds: float, what: str = "") -> EngineFailure:
    return EngineFailure(504, f"polar: engine timeout after {seconds:g} s{what}", "timeout_error", retry=False)


def engine_json(raw: bytes) -> Any:
    """The engine's JSON answer; a body that is not JSON becomes an error object holding its start."""
    try:
        return loads_line(raw or b"{}")
    except ValueError:  # JSONDecodeError, UnicodeDecodeError
        return {"error": {"message": raw[:500].decode(errors="replace")}}


def engine_message(data: Any) -> str:
    err = data.get("error") if isinstance(data, dict) else None
    if isinstance(err, dict):
        return str(err.get("message", err))
    return str(err or data)[:500]


def engine_refused(status: int, data: Any) -> ProviderError:
    """The provider's error for an engine that answered a call with an error status."""
    return ProviderError(400 if status == 400 else 502, f"inference engine answered {status}: {engine_message(data)}",
                         "api_error")


class EngineClient:
    def __init__(self, base_url: str, timeouts: Timeouts) -> None:
        self.base_url, self.timeouts = base_url.rstrip("/"), timeouts
        self._session: aiohttp.ClientSession | None = None

    def http(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=30),
                json_serialize=json.dumps, skip_auto_headers=("User-Agent",), trust_env=False,
            )
        return self._session

    @property
    def opened(self) -> bool:
        return self._session is not None and not self._session.closed

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def complete(self, path: str, body: dict[str, Any]) -> tuple[int, bytes]:
        """(status, body) of a non-streamed call; ProviderError 503/504 when the engine is down or too slow."""
        timeout = aiohttp.ClientTimeout(total=self.timeouts.total_s, sock_connect=10)
        try:
            async with self.http().post(self.base_url + path, data=dumps_line(body),
                                         headers={"content-type": "application/json"}, timeout=timeout) as r:
                return r.status, await r.read()
        except asyncio.TimeoutError as e:
            raise engine_timeout(self.timeouts.total_s) from e
        except aiohttp.ClientError as e:
            raise engine_unreachable(self.base_url, e) from e

    async def open_stream(self, path: str, body: dict[str, Any]) -> aiohttp.ClientResponse:
        """The engine's streamed response, headers received; the caller reads it with `chunks` and releases it."""
        timeout = aiohttp.ClientTimeout(total=self.timeouts.total_s, sock_connect=10,
                                        sock_read=self.timeouts.first_byte_s)
        try:
            return await self.http().post(self.base_url + path, data=dumps_line(body),
                                           headers={"content-type": "application/json"}, timeout=timeout)
        except asyncio.TimeoutError as e:
            raise engine_timeout(self.timeouts.first_byte_s, " waiting for the first byte") from e
        except aiohttp.ClientError as e:
            raise engine_unreachable(self.base_url, e) from e


async def chunks(response: aiohttp.ClientResponse, timeouts: Timeouts) -> AsyncIterator[bytes]:
    """The body as it arrives; raises ProviderError 504 on a stall and 502 when the engine dies mid-stream."""
    try:
        async for chunk in response.content.iter_any():
            yield chunk
    except asyncio.TimeoutError as e:
        raise engine_timeout(timeouts.first_byte_s, " between two chunks of the stream") from e
    except aiohttp.ClientError as e:
        raise EngineFailure(502, f"polar: the engine stream broke off ({type(e).__name__}: {e})", "api_error",
                            retry=False) from e
