"""workers/api/callbacks.deliver against a real HTTP receiver on 127.0.0.1: failed attempts are retried with
growing waits and each attempt is signed afresh; a redirect is recorded as a failure and never followed."""
from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from workers.api import callbacks
from workers.api.callback_policy import CallbackPolicy
from workers.api.callbacks import RetryPolicy, deliver, verify

SECRET = "s3cret"


class Receiver:
    """Answers each POST with the next status of `script` (the last one repeated); records what it got."""

    def __init__(self, script: list[tuple[int, dict[str, str]]]) -> None:
        self.script, self.got = script, []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["content-length"]))
                receiver.got.append((dict(self.headers), body))
                status, headers = receiver.script[min(len(receiver.got), len(receiver.script)) - 1]
                self.send_response(status)
                for k, v in {**headers, "content-length": "0"}.items():
                    self.send_header(k, v)
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/cb"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def waits(monkeypatch) -> list[float]:
    """The waits between attempts, taken instead of slept."""
    taken: list[float] = []
    monkeypatch.setattr(callbacks.time, "sleep", taken.append)
    return taken


@pytest.fixture
def client() -> Iterator[httpx.Client]:
    with httpx.Client(trust_env=False, follow_redirects=False) as c:
        yield c


def send(client: httpx.Client, url: str, retry: RetryPolicy) -> callbacks.Outcome:
    return deliver(client, CallbackPolicy.of(), url, SECRET, "b-1", "sample", "ev-1", {"sample_id": "s-1"}, retry)


def test_failed_attempts_are_retried_with_growing_waits_each_signed(client, waits):
    receiver = Receiver([(503, {}), (500, {}), (200, {})])
    try:
        outcome = send(client, receiver.url, RetryPolicy(attempts=5, base_s=0.5, cap_s=30.0, timeout_s=5.0))
    finally:
        receiver.close()
    assert outcome == callbacks.Outcome(3)
    assert waits == [0.5, 1.0]  # doubling from base_s
    assert len(receiver.got) == 3 and all(verify(SECRET, h, body) for h, body in receiver.got)
    assert len({body for _, body in receiver.got}) == 1  # the same delivery each time


def test_waits_are_capped_and_the_last_error_is_recorded(client, waits):
    receiver = Receiver([(500, {})])
    try:
        outcome = send(client, receiver.url, RetryPolicy(attempts=5, base_s=1.0, cap_s=3.0, timeout_s=5.0))
    finally:
        receiver.close()
    assert waits == [1.0, 2.0, 3.0, 3.0] and len(receiver.got) == 5
    assert outcome.attempts == 5 and outcome.error == "sample s-1: HTTP 500 after 5 attempts"


def test_a_redirect_is_a_failed_delivery_never_followed(client, waits):
    elsewhere = Receiver([(200, {})])
    receiver = Receiver([(302, {"location": elsewhere.url + "?token=abc"})])
    try:
        outcome = send(client, receiver.url, RetryPolicy(attempts=5, base_s=0.5, cap_s=30.0, timeout_s=5.0))
    finally:
        receiver.close()
        elsewhere.close()
    assert (len(receiver.got), elsewhere.got, waits) == (1, [], [])  # one attempt, not retried, not followed
    assert outcome.attempts == 1 and "HTTP 302 redirect to" in outcome.error and "not followed" in outcome.error
    assert "abc" not in outcome.error  # the location is recorded redacted


def test_a_refused_address_is_never_contacted(client, waits):
    outcome = send(client, "http://169.254.169.254/latest/meta-data", RetryPolicy(attempts=3))
    assert outcome.attempts == 1 and "refused by the callback policy" in outcome.error and waits == []
