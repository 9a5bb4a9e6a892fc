"""Sessions: which rollout a request belongs to, from its credentials (DESIGN.md §2)."""
from __future__ import annotations

import base64
import hashlib
import json
import re
import secrets
import time
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import parse_qs, urlsplit

from polar_traj.records import check_id

OPEN_TASK_ID = "local"
REDIS_PREFIX = "polar:session:"
ENDED_CHANNEL = "polar:session-ended"  # unregister_session publishes {task_id, session_id} here
# Headers harnesses send that name their own session (DESIGN.md §7); used in open mode only.
SESSION_HINT_HEADERS = ("x-claude-code-session-id", "session-id", "session_id", "x-session-id")


@dataclass(frozen=True)
class Session:
    task_id: str
    session_id: str


@dataclass(frozen=True)
class Credentials:
    user: str | None  # proxy-auth user name, the session id by convention
    secret: str | None  # proxy-auth password or API key


class SessionStore(Protocol):
    def lookup(self, creds: Credentials, hint: str | None) -> Session | None: ...


def parse_sessions_spec(spec: str) -> SessionStore:
    """`open` or `redis://host:port/db`; raises ValueError for anything else."""
    if spec == "open":
        return OpenSessions()
    if spec.startswith(("redis://", "unix://")):
        return RedisSessions(spec)
    raise ValueError(f"expected 'open' or a redis:// URL, got {spec!r}")


def _safe_id(text: str) -> str:
    """A filesystem-safe session id: readable when the text is, else a short hash."""
    if re.fullmatch(r"[A-Za-z0-9._-]{1,64}", text) and text not in (".", ".."):
        return text
    return "s-" + hashlib.sha256(text.encode()).hexdigest()[:16]


class OpenSessions:
    """Local use: every credential (or harness session header) becomes a session on first sight."""

    def lookup(self, creds: Credentials, hint: str | None) -> Session | None:
        key = creds.user or hint or creds.secret or "anonymous"
        return Session(OPEN_TASK_ID, _safe_id(key))


class RedisSessions:
    """Sessions registered by workers in Redis: `polar:session:<token>` -> {task_id, session_id}."""

    def __init__(self, url: str, cache_s: float = 30.0) -> None:
        import redis

        self.client = redis.Redis.from_url(url, socket_timeout=2.0)
        self.cache_s = cache_s
        self._cache: dict[str, tuple[float, Session]] = {}

    def lookup(self, creds: Credentials, hint: str | None) -> Session | None:
        if not creds.secret:
            return None
        hit = self._cache.get(creds.secret)
        if hit and time.monotonic() - hit[0] < self.cache_s:
            session = hit[1]
        else:
            raw = self.client.get(REDIS_PREFIX + creds.secret)
            if raw is None:
                return None
            data = json.loads(raw)
            session = Session(data["task_id"], data["session_id"])
            self._cache[creds.secret] = (time.monotonic(), session)
        if creds.user is not None and creds.user != session.session_id:
            return None  # a token is only valid with its own session name
        return session


def register_session(redis_url: str, task_id: str, session_id: str, ttl_s: int = 24 * 3600) -> str:
    """Register a rollout session for the proxy; returns its secret token. Both ids must pass `check_id`."""
    import redis

    value = json.dumps({"task_id": check_id(task_id, "task_id"), "session_id": check_id(session_id, "session_id")})
    token = "polar-" + secrets.token_urlsafe(24)
    redis.Redis.from_url(redis_url).set(REDIS_PREFIX + token, value, ex=ttl_s)
    return token


def unregister_session(redis_url: str, token: str) -> None:
    """End a session: its token stops working on the next request and the proxy frees its history."""
    import redis

    client = redis.Redis.from_url(redis_url)
    raw = client.getdel(REDIS_PREFIX + token)
    if raw is not None:
        client.publish(ENDED_CHANNEL, raw)


def proxy_credentials(header: str | None) -> Credentials | None:
    """`Proxy-Authorization: Basic base64(user:password)` -> Credentials."""
    if not header:
        return None
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        user, _, password = base64.b64decode(value.strip()).decode().partition(":")
    except (ValueError, UnicodeDecodeError):
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
