import asyncio
import base64

import pytest

from polar_mitm.sessions.registry import (
    Credentials, OpenSessions, Session, api_key_credentials, hashed_id, parse_sessions_spec, proxy_credentials,
    readable_id, session_hint,
)


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def test_proxy_credentials_are_user_and_token():
    assert proxy_credentials(basic("sess-1", "tok")) == Credentials("sess-1", "tok")
    assert proxy_credentials("Bearer x") is None
    assert proxy_credentials("Basic !!!notbase64") is None
    assert proxy_credentials(None) is None


@pytest.mark.parametrize(
    "headers,url,secret",
    [
        ({"authorization": "Bearer tok"}, "http://h/v1/chat/completions", "tok"),
        ({"x-api-key": "tok"}, "http://h/v1/messages", "tok"),
        ({"x-goog-api-key": "tok"}, "http://h/v1beta/models/m:generateContent", "tok"),
        ({}, "http://h/v1beta/models/m:generateContent?key=tok&alt=sse", "tok"),
    ],
)
def test_api_key_found_wherever_the_sdk_puts_it(headers, url, secret):
    assert api_key_credentials(headers, url) == Credentials(None, secret)


def lookup(store, creds, hint):
    return asyncio.run(store.lookup(creds, hint))


def test_open_sessions_key_on_user_then_hint_then_hashed_key():
    store = OpenSessions()
    assert lookup(store, Credentials("run-7", "x"), "hint") == Session("local", "run-7")
    assert lookup(store, Credentials(None, "key"), "abc-123") == Session("local", "abc-123")
    # an API key never becomes a file name or a dataset value: only its hash does
    s = lookup(store, Credentials(None, "sk-secret-key"), None)
    assert s == Session("local", hashed_id("sk-secret-key")) and "secret" not in s.session_id
    # unsafe names become a stable hash, never a path
    s = lookup(store, Credentials("../etc", None), None)
    assert "/" not in s.session_id and s == lookup(store, Credentials("../etc", None), None)


def test_readable_ids_never_collide_with_hashed_ones():
    hashed = readable_id("run 1")
    assert hashed.startswith("s-") and readable_id(hashed) != hashed
    assert readable_id("run-1") == "run-1"
    # invalid bytes kept by mitmproxy as surrogates hash without raising
    assert readable_id("\udcff").startswith("s-")


def test_session_hint_headers():
    assert session_hint({"x-claude-code-session-id": "c1"}) == "c1"
    assert session_hint({"session_id": "p1"}) == "p1"
    assert session_hint({}) is None


def test_sessions_spec_is_validated():
    assert isinstance(parse_sessions_spec("open"), OpenSessions)
    with pytest.raises(ValueError, match="redis://"):
        parse_sessions_spec("closed")
