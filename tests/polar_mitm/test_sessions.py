import base64

import pytest

from polar_mitm.sessions import (
    Credentials, OpenSessions, Session, api_key_credentials, parse_sessions_spec, proxy_credentials, session_hint,
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


def test_open_sessions_key_on_user_then_hint_then_key():
    store = OpenSessions()
    assert store.lookup(Credentials("run-7", "x"), "hint") == Session("local", "run-7")
    assert store.lookup(Credentials(None, "key"), "abc-123") == Session("local", "abc-123")
    assert store.lookup(Credentials(None, "key"), None) == Session("local", "key")
    # unsafe names become a stable hash, never a path
    s = store.lookup(Credentials("../etc", None), None)
    assert "/" not in s.session_id and s == store.lookup(Credentials("../etc", None), None)


def test_session_hint_headers():
    assert session_hint({"x-claude-code-session-id": "c1"}) == "c1"
    assert session_hint({"session_id": "p1"}) == "p1"
    assert session_hint({}) is None


def test_sessions_spec_is_validated():
    assert isinstance(parse_sessions_spec("open"), OpenSessions)
    with pytest.raises(ValueError, match="redis://"):
        parse_sessions_spec("closed")
