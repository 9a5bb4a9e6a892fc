"""The adversarial review's vectors (issue 14), each closed where it starts: no tunnel through the proxy, no
credential that skips authentication, no host option that names a local service, no id that escapes the
capture folder, no secret as a file name, no decompression bomb, and revocation that takes effect at once.
Egress is checked against a listener bound as the provider hosts (private /etc/hosts, loopback only)."""
from __future__ import annotations

import gzip
import json
import socket
import ssl
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import redis

from polar_mitm.gate.guard import parse_hosts
from polar_mitm.launch import ADDON, free_port, stop
from polar_mitm.sessions.registry import REDIS_PREFIX, register_session, unregister_session
from polar_traj.records import record_path
from tests.polar_mitm.conftest import needs_root, start_proxy
from tests.polar_mitm.provider_requests import is_provider_error
from tests.redis_server import redis_server

CHAT = {"model": "tiny", "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
def guarded(tmp_path, reference_server, tiny_model_dir, provider_host):
    """start(*extra) -> a proxy whose hostnames resolve to the counting listener; counts what reached it."""
    listener, hosts = provider_host
    started = []

    def start(*extra: str):
        proc, proxy = start_proxy(tmp_path / f"p{len(started)}", reference_server, tiny_model_dir, *extra,
                                  hosts_file=hosts, reverse_target=f"http://{listener.host}:443")
        started.append(proc)
        return proxy

    before = listener.accepted_before_now()
    yield start, lambda: listener.accepted_before_now() - before - 1
    for proc in started:
        stop(proc)


def connect(port: int, target: str, auth: str = "") -> tuple[socket.socket, bytes]:
    s = socket.create_connection(("127.0.0.1", port), timeout=20)
    extra = f"Proxy-Authorization: Basic {auth}\r\n" if auth else ""
    s.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n{extra}\r\n".encode())
    return s, s.recv(4096)


def drain(s: socket.socket) -> bytes:
    data = b""
    try:
        while chunk := s.recv(4096):
            data += chunk
    except OSError:
        pass
    return data


@needs_root
def test_a_connect_tunnel_never_becomes_raw_tcp_tls_or_dns(guarded):
    start, leaked = guarded
    proxy = start()
    # 1) non-HTTP bytes right after CONNECT :443 (mitmproxy's raw TCP layer would forward them)
    s, head = connect(proxy.proxy_port, "api.openai.com:443")
    assert head.startswith(b"HTTP/1.1 200")
    s.sendall(b"\r\nGET /v1/files HTTP/1.1\r\nHost: api.openai.com\r\n\r\n")
    drain(s)
    s.close()
    # 2) other ports of a provider host: SSH, DNS
    for port in (22, 53):
        s, head = connect(proxy.proxy_port, f"api.openai.com:{port}")
        assert head.startswith(b"HTTP/1.1 403"), head
        s.close()
    # 3) inside intercepted TLS, a payload that is not HTTP (domain fronting through the TLS layer)
    s, head = connect(proxy.proxy_port, "api.openai.com:443")
    ctx = ssl.create_default_context(cafile=str(proxy.ca_cert))
    tls = ctx.wrap_socket(s, server_hostname="api.openai.com")
    tls.sendall(b"\x00\x01\x02 not http at all\n")
    drain(tls)
    tls.close()
    assert leaked() == 0


def test_modes_that_skip_connect_and_local_hosts_are_refused_at_start(tmp_path, tiny_model_dir):
    mitmdump = str(Path(sys.executable).parent / "mitmdump")
    for extra, option in ((("--set", "polar_hosts=localhost"), "polar_hosts"),
                          (("--set", "polar_hosts=127.0.0.1"), "polar_hosts"),
                          (("--set", "ignore_hosts=api.openai.com"), "ignore_hosts"),
                          (("--mode", f"socks5@127.0.0.1:{free_port()}"), "mode")):
        r = subprocess.run([mitmdump, "-q", "-s", str(ADDON), "--set", f"polar_tokenizer={tiny_model_dir}",
                            "--set", f"confdir={tmp_path}", "--mode", f"regular@127.0.0.1:{free_port()}", *extra],
                           capture_output=True, text=True, timeout=300)
        assert f"OptionsError: {option}:" in r.stdout + r.stderr, (extra, (r.stdout + r.stderr)[-800:])


@pytest.mark.parametrize("host", ["localhost", "127.0.0.1", "[::1]", "::1", "redis", "api.localhost", "1.2.3"])
def test_polar_hosts_accepts_only_public_hostnames(host):
    with pytest.raises(ValueError):
        parse_hosts(host)
    assert "llm.example.org" in parse_hosts("llm.example.org")


def absolute_form(port: int, url: str, headers: dict[str, str], body: bytes) -> bytes:
    """A plain-HTTP absolute-form proxy request with raw header bytes (what httpx would refuse to send);
    returns the whole answer (status line, headers, body)."""
    lines = [f"POST {url} HTTP/1.1".encode(), b"Host: api.openai.com", b"Content-Type: application/json",
             f"Content-Length: {len(body)}".encode(), b"Connection: close"]
    lines += [k.encode() + b": " + v.encode("latin-1") for k, v in headers.items()]
    with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
        s.sendall(b"\r\n".join(lines) + b"\r\n\r\n" + body)
        return drain(s)


@needs_root
def test_invalid_credential_bytes_and_a_dead_session_store_are_answered_locally(guarded, tmp_path):
    start, leaked = guarded
    body = json.dumps(CHAT).encode()
    with redis_server(tmp_path) as url:
        proxy = start("--set", f"polar_sessions={url}")
        for scheme in ("http", "https"):
            answer = absolute_form(proxy.proxy_port, f"{scheme}://api.openai.com/v1/chat/completions",
                                   {"Authorization": "Bearer \xff", "x-api-key": "real-provider-key"}, body)
            assert answer.startswith(b"HTTP/1.1 407"), answer[:200]
    # the Redis server is gone now: an outage is answered here too
    answer = absolute_form(proxy.proxy_port, "http://api.openai.com/v1/chat/completions",
                           {"Authorization": "Bearer polar-token"}, body)
    assert answer.startswith(b"HTTP/1.1 503") and b"session store unavailable" in answer
    # open mode: an invalid byte in a session header becomes a hashed session, answered by the engine
    open_proxy = start()
    answer = absolute_form(open_proxy.proxy_port, "http://api.openai.com/v1/chat/completions",
                           {"session-id": "\xff", "x-api-key": "real-provider-key"}, body)
    assert answer.startswith(b"HTTP/1.1 200"), answer[:300]
    names = [p.name for p in open_proxy.capture_dir.glob("*/*.jsonl")]
    assert names and all(n.startswith("s-") for n in names)
    assert leaked() == 0


def test_ids_never_name_a_path_outside_the_capture_folder(tmp_path, reference_server, tiny_model_dir):
    for bad in ("../x", "/abs", "a/b", "..", ".hidden", ""):
        with pytest.raises(ValueError):
            record_path(tmp_path, bad, "s")
        with pytest.raises(ValueError):
            record_path(tmp_path, "t", bad)
    with redis_server(tmp_path) as url:
        with pytest.raises(ValueError):
            register_session(url, "../../tmp/x", "run-1")
        # a forged entry written straight into Redis is not trusted either
        redis.Redis.from_url(url).set(REDIS_PREFIX + "forged", json.dumps({"task_id": "../../escape", "session_id": "a"}))
        proc, proxy = start_proxy(tmp_path / "p", reference_server, tiny_model_dir, "--set", f"polar_sessions={url}")
        try:
            r = httpx.post(proxy.base_url + "/v1/chat/completions", json=CHAT, headers={"authorization": "Bearer forged"})
            assert r.status_code == 401 and is_provider_error("openai_chat", r.json())
        finally:
            stop(proc)
    assert not list(tmp_path.rglob("escape*")) and not list(proxy.capture_dir.rglob("*.jsonl"))


def test_an_api_key_is_never_a_file_name_or_a_record_value(proxy):
    secret = "sk-ant-live-0123456789abcdef"
    r = httpx.post(proxy.base_url + "/v1/messages", json=CHAT, headers={"x-api-key": secret, "anthropic-version": "1"})
    assert r.status_code == 200
    files = list(proxy.capture_dir.rglob("*.jsonl"))
    assert files and not any(secret in f.name for f in files)
    assert not any(secret in f.read_text() for f in files)
    assert secret not in proxy.log.read_text()
    r = httpx.post(proxy.base_url + "/v1beta/models/tiny:generateContent?key=" + secret,
                   json={"contents": [{"role": "user", "parts": [{"text": "hi"}]}],
                         "generationConfig": {"maxOutputTokens": 3}})  # not 2048 tokens: past httpx's 5 s on a busy CI
    assert r.status_code == 200
    assert not any(secret in f.read_text() for f in proxy.capture_dir.rglob("*.jsonl"))


def test_a_decompression_bomb_is_refused_with_413(tmp_path, reference_server, tiny_model_dir):
    proc, proxy = start_proxy(tmp_path, reference_server, tiny_model_dir, "--set", "polar_max_body=1000000")
    try:
        bomb = gzip.compress(b'{"messages": "' + b" " * 3_000_000 + b'"}')
        assert len(bomb) < 10_000
        for path, headers, api in (("/v1/messages/count_tokens", {"x-api-key": "b"}, "anthropic"),
                                   ("/v1/chat/completions", {"authorization": "Bearer b"}, "openai_chat")):
            r = httpx.post(proxy.base_url + path, content=bomb,
                           headers={**headers, "content-encoding": "gzip", "content-type": "application/json"})
            assert r.status_code == 413 and is_provider_error(api, r.json()), r.text[:200]
        r = httpx.post(proxy.base_url + "/v1/chat/completions", content=b"x" * 1_100_000,
                       headers={"authorization": "Bearer b", "content-type": "application/json"})
        assert r.status_code == 413
    finally:
        stop(proc)


def test_unregistering_a_session_takes_effect_on_the_next_request(tmp_path, reference_server, tiny_model_dir):
    with redis_server(tmp_path) as url:
        proc, proxy = start_proxy(tmp_path / "p", reference_server, tiny_model_dir, "--set", f"polar_sessions={url}")
        try:
            token = register_session(url, "task-1", "run-1")
            base = httpx.Client(base_url=proxy.base_url, headers={"authorization": f"Bearer {token}"}, timeout=60)
            tunnel = httpx.Client(proxy=proxy.proxy_url("run-1", token), verify=str(proxy.ca_cert), timeout=60)
            assert base.post("/v1/chat/completions", json=CHAT).status_code == 200
            assert tunnel.post("https://api.openai.com/v1/chat/completions", json=CHAT).status_code == 200
            unregister_session(url, token)
            assert base.post("/v1/chat/completions", json=CHAT).status_code == 401
            # the same open tunnel (keep-alive) loses its session too
            assert tunnel.post("https://api.openai.com/v1/chat/completions", json=CHAT).status_code == 407
        finally:
            stop(proc)


def test_a_call_whose_record_failed_is_not_in_the_history(tmp_path, tiny_model_dir):
    from tests.polar_mitm.stub_engine import StubEngine
    from tests.polar_mitm.test_fail_closed import FAULT_ADDON
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    stub = StubEngine(tok.encode("fine", add_special_tokens=False) + [tok.convert_tokens_to_ids("<|im_end|>")])
    proc, proxy = start_proxy(tmp_path, stub.url, tiny_model_dir, "-s", str(FAULT_ADDON),
                              "--set", "polar_test_fault=capture_once")
    try:
        headers = {"authorization": "Bearer h"}
        first = httpx.post(proxy.base_url + "/v1/chat/completions", json=CHAT, headers=headers)
        assert first.status_code == 500  # the reply was never recorded, so it is not sent
        again = {**CHAT, "messages": CHAT["messages"] + [{"role": "assistant", "content": "fine"},
                                                           {"role": "user", "content": "and then?"}]}
        assert httpx.post(proxy.base_url + "/v1/chat/completions", json=again, headers=headers).status_code == 200
        failed, second = proxy.records("h")
        assert failed["error"] and second["error"] is None
        assert second["parent_call_id"] is None and second["prefix_source"].startswith("rendered:")
    finally:
        stop(proc)
