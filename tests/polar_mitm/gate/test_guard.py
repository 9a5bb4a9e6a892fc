"""polar_mitm/gate/guard.py's header view: what the stages read a request's headers through."""
from __future__ import annotations

from mitmproxy import http
from mitmproxy.test import tflow

from polar_mitm.gate.guard import request_headers


def test_request_headers_read_like_mitmproxys_headers():
    flow = tflow.tflow()
    flow.request.headers = http.Headers([
        (b"Authorization", b"Bearer sk-1"), (b"X-Polar-Session", b"s1"), (b"accept", b"a/b"), (b"Accept", b"c/d"),
        (b"X-Caf\xc3\xa9", b"\xff\xfe raw"), (b"Content-Type", b"application/json"),
    ])
    expected = {k.lower(): v for k, v in flow.request.headers.items()}
    assert request_headers(flow) == expected
    assert expected["accept"] == "a/b, c/d"  # a repeated header's values joined, as Headers does
