"""Sessions: which rollout a request belongs to, from its credentials (docs/design.md §2).

Ids that name files must never carry a secret or a path: a readable name is kept only when it comes from the
proxy-auth user or a harness's session header and already has the shape of `check_id`; anything else (and
every API key) becomes `s-<hash>`. Readable names never start with `s-`, so the mapping is injective.
"""
from __future__ import annotations

import base64
import hashlib
import json
import logging
import re
import secrets
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import parse_qs, urlsplit

from polar_mitm.conversation import Sampling
from polar_mitm.engines.backends import placement_key
from polar_mitm.sessions.sampling import parse_sampling, sampling_dict
from polar_traj.records import ID_PATTERN, check_id

log = logging.getLogger(__name__)
OPEN_TASK_ID = "local"
REDIS_PREFIX = "polar:session:"
CALLS_PREFIX = "polar:calls:"  # + task_id/session_id: the session's LLM calls so far (INCR), for its call cap
ENDED_CHANNEL = "polar:session-ended"  # unregister_session publishes {task_id, session_id} here
# Headers harnesses send that name their own session (docs/design.md §7); used in open mode only.
SESSION_HINT_HEADERS = ("x-claude-code-session-id", "session-id", "session_id", "x-session-id")
# A credential is printable ASCII; anything else (mitmproxy keeps invalid header bytes as surrogates) is refused.
_CREDENTIAL = re.compile(r"[\x21-\x7e]{1,512}")


@dataclass(frozen=True)
class Session:
    task_id: str
    session_id: str
    sampling: Sampling | None = None  # fixed by the trainer (polar_mitm/sessions/sampling.py); None: each request's own
    max_calls: int | None = None  # LLM calls the session may make; None: no cap


@dataclass(frozen=True)
class Credentials:
    user: str | None  # proxy-auth user name, the session id by convention
    secret: str | None  # proxy-auth password or API key


class SessionStoreError(Exception):
    """The session store could not be asked (e.g. Redis is down): the flow is answered here, never passed on."""


class SessionStore(Protocol):
    async def lookup(self, creds: Credentials, hint: str | None) -> Session | None: ...

    async def count_call(self, session: Session) -> int: ...


def redis_url_of(spec: str) -> str | None:
    """The Redis URL a `--sessions` value names (redis:// or unix://), or None for open mode."""
    return spec if spec.startswith(("redis://", "unix://")) else None


def parse_sessions_spec(spec: str) -> "OpenSessions | RedisSessions":
    """`open` or `redis://host:port/db` (or `unix://…`); raises ValueError for anything else."""
    if spec == "open":
        return OpenSessions()
    if redis_url_of(spec):
        return RedisSessions(spec)
    raise ValueError(f"expected 'open' or a redis:// URL, got {spec!r}")


def valid_credential(text: str | None) -> bool:
    return text is not None and _CREDENTIAL.fullmatch(text) is not None


def hashed_id(text: str) -> str:
    """`s-` + a hash: the id for a name that is not a safe id, or that is a secret."""
    return "s-" + hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()[:24]


def readable_id(text: str) -> str:
    """The name itself when it is a safe id (and cannot be mistaken for a hashed one), else its hash."""
    if ID_PATTERN.fullmatch(text) and not text.startswith("s-"):
        return text
    return hashed_id(text)


class OpenSessions:
    """Local use: every credential (or harness session header) becomes a session on first sight."""

    async def lookup(self, creds: Credentials, hint: str | None) -> Session | None:
        if creds.user:
            return Session(OPEN_TASK_ID, readable_id(creds.user))
        if hint:
            return Session(OPEN_TASK_ID, readable_id(hint))
        if creds.secret:
            return Session(OPEN_TASK_ID, hashed_id(creds.secret))  # an API key is never a file name
        return Session(OPEN_TASK_ID, "anonymous")

    async def count_call(self, session: Session) -> int:
        return 0  # open sessions carry no call cap


class RedisSessions:
    """Sessions registered by workers in Redis: `polar:session:<token>` -> {task_id, session_id}.

    Asked on every request (no cache), asynchronously: an unregistered token stops working at once and a slow
    Redis stalls only the requests that wait for it."""

    def __init__(self, url: str, timeout_s: float = 2.0) -> None:
        import redis.asyncio

        self.url = url
        self.client = redis.asyncio.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)

    async def lookup(self, creds: Credentials, hint: str | None) -> Session | None:
        if not valid_credential(creds.secret) or (creds.user is not None and not valid_credential(creds.user)):
            return None
        try:
            raw = await self.client.get(REDIS_PREFIX + creds.secret)
        except Exception as e:  # redis.exceptions.RedisError, OSError, timeouts
            raise SessionStoreError(f"session store {self.url} unavailable: {type(e).__name__}: {e}") from e
        if raw is None:
            return None
        try:
            session = session_of(json.loads(raw))
        except (ValueError, KeyError, TypeError):
            return None  # a forged or corrupt entry never names a file
        if creds.user is not None and creds.user != session.session_id:
            return None  # a token is only valid with its own session name
        return session

    async def count_call(self, session: Session, ttl_s: int = 24 * 3600) -> int:
        """One more LLM call of `session`: how many it has made, this one included. Counted in Redis, so every
        proxy that serves the session agrees. Raises SessionStoreError."""
        key = calls_key(session.task_id, session.session_id)
        try:
            async with self.client.pipeline(transaction=True) as pipe:
                count, _ = await pipe.incr(key).expire(key, ttl_s).execute()
        except Exception as e:  # redis.exceptions.RedisError, OSError, timeouts
            raise SessionStoreError(f"session store {self.url} unavailable: {type(e).__name__}: {e}") from e
        return int(count)


def session_of(data: dict) -> Session:
    """A registered session from its Redis value; raises ValueError, KeyError or TypeError when it is corrupt."""
    max_calls = data.get("max_calls")
    if max_calls is not None and (isinstance(max_calls, bool) or not isinstance(max_calls, int) or max_calls < 1):
        raise ValueError(f"max_calls: expected a whole number >= 1, got {max_calls!r}")
    return Session(check_id(data["task_id"], "task_id"), check_id(data["session_id"], "session_id"),
                   parse_sampling(data.get("sampling")), max_calls)


def calls_key(task_id: str, session_id: str) -> str:
    return f"{CALLS_PREFIX}{task_id}/{session_id}"


def register_session(redis_url: str, task_id: str, session_id: str, ttl_s: int = 24 * 3600, *,
                     sampling: Sampling | None = None, max_calls: int | None = None) -> str:
    """Register a rollout session for the proxy; returns its secret token. Both ids must pass `check_id`.
    `sampling`: values every call of the session is sampled with; `max_calls`: the session's call cap."""
    import redis

    data = {"task_id": check_id(task_id, "task_id"), "session_id": check_id(session_id, "session_id")}
    if sampling_dict(sampling):
        data["sampling"] = sampling_dict(sampling)
    if max_calls is not None:
        data["max_calls"] = max_calls
    session_of(data)  # what the proxy would refuse is refused here, loudly
    token = "polar-" + secrets.token_urlsafe(24)
    redis.Redis.from_url(redis_url).set(REDIS_PREFIX + token, json.dumps(data), ex=ttl_s)
    return token


def unregister_session(redis_url: str, token: str) -> None:
    """End a session: its token stops working on the next request and the proxy frees its history."""
    import redis

    client = redis.Redis.from_url(redis_url)
    raw = client.getdel(REDIS_PREFIX + token)
    if raw is not None:
        client.publish(ENDED_CHANNEL, raw)
        session = json.loads(raw)
        client.delete(placement_key(session["task_id"], session["session_id"]),
                      calls_key(session["task_id"], session["session_id"]))


def watch_ended(redis_url: str, on_end):
    """Call `on_end(task_id, session_id)` for every session unregistered from now on; returns the background
    asyncio task."""
    import asyncio

    import redis.asyncio

    async def listen() -> None:
        while True:
            try:
                pubsub = redis.asyncio.Redis.from_url(redis_url).pubsub(ignore_subscribe_messages=True)
                await pubsub.subscribe(ENDED_CHANNEL)
                async for message in pubsub.listen():
                    data = json.loads(message["data"])
                    on_end(data["task_id"], data["session_id"])
            except asyncio.CancelledError:
                raise
            except Exception as e:  # Redis away or a bad message: sessions then end by TTL; try again
                log.warning("polar: watching ended sessions: %s: %s", type(e).__name__, e)
                await asyncio.sleep(2.0)

    return asyncio.get_running_loop().create_task(listen())


def proxy_credentials(header: str | None) -> Credentials | None:
    """`Proxy-Authorization: Basic base64(user:password)` -> Credentials."""
    if not header:
        return None
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        user, _, password = base64.b64decode(value.strip(), validate=True).decode().partition(":")
    except (ValueError, UnicodeError):
        return None
    return Credentials(user or None, password or None)


def api_key_credentials(headers: dict[str, str], url: str) -> Credentials | None:
    """The provider API key, wherever the SDK put it: Bearer, x-api-key, x-goog-api-key or ?key=."""
    auth = headers.get("authorization", "")
    if auth.lower().startswith("bearer "):
        return Credentials(None, auth[7:].strip() or None)
    for name in ("x-api-key", "x-goog-api-key"):
        if headers.get(name):
            return Credentials(None, headers[name].strip())
    key = parse_qs(urlsplit(url).query).get("key")
    if key:
        return Credentials(None, key[0])
    return None


def session_hint(headers: dict[str, str]) -> str | None:
    for name in SESSION_HINT_HEADERS:
        if headers.get(name):
            return headers[name]
    return None
