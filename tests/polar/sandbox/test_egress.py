"""The verifier's egress proxy (polar/sandbox/egress.py): allowed hosts reached (plain HTTP and CONNECT), every
other host or port refused with a 403 and logged, never connected to; the list's forms and its errors. The
hosts are stand-ins on 127.0.0.1 (`name=127.0.0.1:PORT`): no test reaches the internet."""
from __future__ import annotations

import http.server
import json
import socket
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

import pytest

from polar.sandbox.egress import DEFAULT_HOSTS, EgressError, EgressProxy, parse_hosts


@contextmanager
def stand_in_host(answer: Callable[[str, str], bytes | None]) -> Iterator[tuple[int, list[str]]]:
    """An HTTP host on 127.0.0.1 answering GET PATH with answer(path, Host header) (None: 404): (its port, the
    paths it was asked for)."""
    asked: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            asked.append(self.path)
            body = answer(self.path, self.headers["Host"])
            self.send_response(404 if body is None else 200)
            self.send_header("Content-Length", str(len(body or b"")))
            self.end_headers()
            self.wfile.write(body or b"")

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[1], asked
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def mirror() -> Iterator[tuple[int, list[str]]]:
    """A stand-in package mirror: (its port, the paths it was asked for)."""
    with stand_in_host(lambda path, host: f"package at {path} for {host}\n".encode()) as served:
        yield served


def ask(sock_path: Path, request: bytes) -> bytes:
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(20)
        s.connect(str(sock_path))
        s.sendall(request)
        s.shutdown(socket.SHUT_WR)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    return data


def log_lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_allowed_hosts_are_reached_and_others_refused_and_logged(tmp_path, mirror):
    port, asked = mirror
    log = tmp_path / "egress.jsonl"
    allow = parse_hosts([f"deb.mirror.test=127.0.0.1:{port}", f"*.pypi.test", f"files.pypi.test=127.0.0.1:{port}"])
    with EgressProxy(tmp_path / "egress.sock", allow, log) as proxy:
        plain = ask(proxy.path, b"GET http://deb.mirror.test/pool/curl.deb HTTP/1.1\r\nHost: deb.mirror.test\r\n"
                                b"Proxy-Connection: keep-alive\r\n\r\n")
        assert plain.startswith(b"HTTP/1.0 200") and plain.endswith(b"package at /pool/curl.deb for deb.mirror.test\n")
        # CONNECT tunnels bytes both ways (TLS in real use; the stand-in speaks HTTP through the tunnel)
        tunnel = ask(proxy.path, b"CONNECT files.pypi.test:443 HTTP/1.1\r\nHost: files.pypi.test:443\r\n\r\n"
                                 b"GET /pytest.whl HTTP/1.1\r\nHost: files.pypi.test\r\nConnection: close\r\n\r\n")
        assert tunnel.startswith(b"HTTP/1.1 200 Connection established\r\n\r\nHTTP/1.0 200"), tunnel
        for request in (b"GET http://evil.test/x HTTP/1.1\r\nHost: evil.test\r\n\r\n",
                        b"CONNECT evil.test:443 HTTP/1.1\r\n\r\n",
                        b"CONNECT deb.mirror.test:22 HTTP/1.1\r\n\r\n",
                        b"GET /not-a-proxy-request HTTP/1.1\r\n\r\n"):
            refused = ask(proxy.path, request)
            assert refused.startswith(b"HTTP/1.1 403 Forbidden"), refused
    assert asked == ["/pool/curl.deb", "/pytest.whl"]  # the refused ones never reached anything
    lines = [(line["method"], line["host"], line["port"], line["allowed"], line.get("why", "")) for line in
             log_lines(log)]
    assert lines == [("GET", "deb.mirror.test", 80, True, ""), ("CONNECT", "files.pypi.test", 443, True, ""),
                     ("GET", "evil.test", 80, False, "not on the verifier's host list"),
                     ("CONNECT", "evil.test", 443, False, "not on the verifier's host list"),
                     ("CONNECT", "deb.mirror.test", 22, False, "port 22 (only 80, 443)"),
                     ("GET", None, 0, False, "not an HTTP proxy request")]
    assert not (tmp_path / "egress.sock").exists()  # removed with the proxy


def test_a_listed_name_that_resolves_to_this_node_is_refused(tmp_path, mirror):
    """`localhost` on the list still reaches nothing of the node's own (its Redis, its engine): only an operator's
    `host=target:port` may name a loopback or private address."""
    port, asked = mirror
    log = tmp_path / "egress.jsonl"
    with EgressProxy(tmp_path / "egress.sock", parse_hosts(["localhost"]), log) as proxy:
        answer = ask(proxy.path, f"CONNECT localhost:443 HTTP/1.1\r\n\r\nGET / HTTP/1.1\r\n\r\n".encode())
    assert answer.startswith(b"HTTP/1.1 502") and asked == []
    line = log_lines(log)[-1]
    assert (line["host"], line["allowed"]) == ("localhost", False)
    assert line["why"].startswith("connect failed: localhost resolves to 127.0.0.1") or "::1" in line["why"], line


def test_a_socket_path_past_af_unix_length_still_serves(tmp_path, mirror):
    """A batch's verify folder can pass AF_UNIX's 108 bytes: the proxy binds and the in-sandbox forwarder connects
    through the folder's descriptor (before: `OSError: AF_UNIX path too long`, every such sample masked)."""
    from polar.sandbox import bridge
    from polar_mitm.launch import free_port

    port, asked = mirror
    folder = tmp_path / ("b20261207-213027-a77594." + "x" * 60) / "verify" / "shared"
    folder.mkdir(parents=True)
    assert len(str(folder / "egress.sock")) > 108
    with EgressProxy(folder / "egress.sock", parse_hosts([f"mirror.test=127.0.0.1:{port}"]), tmp_path / "l"):
        inside = free_port()
        forwarder = bridge.tcp_to_unix("127.0.0.1", inside, str(folder / "egress.sock"))
        try:
            with socket.create_connection(("127.0.0.1", inside), timeout=20) as s:
                s.sendall(b"GET http://mirror.test/deep HTTP/1.1\r\nHost: mirror.test\r\n\r\n")
                answer = b"".join(iter(lambda: s.recv(65536), b""))
        finally:
            forwarder.close()
    assert answer.startswith(b"HTTP/1.0 200") and asked == ["/deep"]


def test_the_list_forms_and_its_errors():
    allow = parse_hosts(["pypi.org, *.debian.org", "mirror.test=127.0.0.1:8080"])
    assert allow.allows("pypi.org") and allow.allows("deb.debian.org") and allow.allows("PyPI.org.")
    assert not allow.allows("debian.org") and not allow.allows("pypi.org.evil.test")
    assert allow.target("mirror.test", 80) == ("127.0.0.1", 8080) and allow.target("pypi.org", 443) == ("pypi.org", 443)
    assert parse_hosts(allow.entries()) == allow
    assert set(DEFAULT_HOSTS) <= set(parse_hosts(DEFAULT_HOSTS).patterns)
    for bad in ("http://pypi.org", "pypi.org/simple", "a b=c", "*.x=1.2.3.4:80", "m=host"):
        with pytest.raises(EgressError, match="verifier hosts"):
            parse_hosts([bad])
