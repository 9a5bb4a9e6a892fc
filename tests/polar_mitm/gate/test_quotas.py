"""One session cannot hurt its neighbours on a shared proxy (issue 24): its large bodies do not stall another
session's calls, its refused calls leave bounded records, its calls in flight and request bytes per minute
are capped (429 in the provider's shape, and a record), and streamed calls whose clients hang up before the
relay picks them up do not stay in memory."""
from __future__ import annotations

import hashlib
import json
import socket
import threading
import time

import httpx
import pytest

from polar_mitm.launch import stop
from tests.polar_mitm.conftest import start_proxy
from tests.polar_mitm.provider_requests import APIS, is_provider_error, provider_request, send
from tests.polar_mitm.stub_engine import StubEngine

MiB = 2**20


@pytest.fixture(scope="module")
def stub(tiny_model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    return StubEngine(tok.encode("fine, thanks", add_special_tokens=False) + [tok.convert_tokens_to_ids("<|im_end|>")])


@pytest.fixture()
def proxy_of(tmp_path, stub, tiny_model_dir):
    started = []

    def start(*extra: str, engine: StubEngine = stub):
        proc, handle = start_proxy(tmp_path / f"p{len(started)}", engine.url, tiny_model_dir, *extra)
        started.append(proc)
        return handle

    yield start
    for proc in started:
        stop(proc)


def chat(text: str, **extra) -> dict:
    return {"model": "tiny", "max_tokens": 4, "messages": [{"role": "user", "content": text}], **extra}


def post(proxy, key: str, body: dict, timeout: float = 120) -> httpx.Response:
    return httpx.post(proxy.base_url + "/v1/chat/completions", content=json.dumps(body).encode(), timeout=timeout,
                      headers={"authorization": f"Bearer {key}", "content-type": "application/json"})


def capture_bytes(proxy, key: str) -> int:
    return sum(len(json.dumps(r)) for r in proxy.records(key))


def test_a_sessions_huge_bodies_do_not_stall_another_sessions_calls(proxy_of):
    proxy = proxy_of()
    quiet = []
    for n in range(5):
        t = time.perf_counter()
        assert post(proxy, "a", chat(f"hello {n}")).status_code == 200
        quiet.append(time.perf_counter() - t)
    big = "word " * (19 * MiB // 5)  # far past the context: refused, after the proxy has read it
    answers: list[httpx.Response] = []
    senders = [threading.Thread(target=lambda: answers.append(post(proxy, "b", chat(big)))) for _ in range(2)]
    for s in senders:
        s.start()
    busy = []
    while any(s.is_alive() for s in senders) or len(busy) < 5:
        t = time.perf_counter()
        assert post(proxy, "a", chat(f"again {len(busy)}")).status_code == 200
        busy.append(time.perf_counter() - t)
    for s in senders:
        s.join()
    print(f"A's calls: quiet worst {max(quiet) * 1000:.0f} ms, beside B's 19 MiB bodies worst {max(busy) * 1000:.0f} ms")
    # was 30 s: the body was tokenized in full on the proxy's one event loop (0.2 s now, quiet machine); the
    # bound is far from both, so a loaded machine does not fail it and a stall cannot pass it (bench/proxy.py
    # measures the ratio)
    assert max(busy) < 5.0
    assert [r.status_code for r in answers] == [400, 400]
    assert all(r.json()["error"]["code"] == "context_length_exceeded" for r in answers)
    records = proxy.records("b")
    assert len(records) == 2 and all(r["error"] and r["prompt_ids"] == [] for r in records)
    assert capture_bytes(proxy, "b") < 1 * MiB  # was 72 MB: both bodies, and the prompt ids of each
    kept = records[0]["request"]["polar_refused_body"]
    raw = json.dumps(chat(big)).encode()
    assert kept["bytes"] == len(raw) and kept["sha256"] == hashlib.sha256(raw).hexdigest()
    assert raw.decode().startswith(kept["head"]) and len(kept["head"]) == 64 * 1024


def test_a_large_body_that_fits_is_answered_and_recorded_whole(proxy_of):
    proxy = proxy_of()
    body = chat("hi", metadata={"note": "x" * (3 * MiB)})  # above the off-loop threshold, not rendered
    r = post(proxy, "large", body)
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "fine, thanks"
    (record,) = proxy.records("large")
    assert record["error"] is None and record["request"] == body and record["prompt_ids"]


def test_calls_in_flight_per_session_are_capped(tiny_model_dir, proxy_of):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    slow = StubEngine(tok.encode("ok", add_special_tokens=False))
    slow.mode = "hang"
    proxy = proxy_of("--set", "polar_session_max_inflight=2", "--set", "polar_engine_timeout=4", engine=slow)
    hanging = [threading.Thread(target=post, args=(proxy, "busy", chat(f"wait {n}"))) for n in range(2)]
    for h in hanging:
        h.start()
    deadline = time.monotonic() + 10
    while slow.requests < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert slow.requests == 2
    for api in APIS:
        r = send(proxy, provider_request(api, "one more", False, key="busy"), "base_url")
        assert r.status_code == 429 and is_provider_error(api, r.json()), r.text[:300]
        assert "in flight" in r.text
    slow.mode = "ok"
    assert post(proxy, "other", chat("a neighbour")).status_code == 200  # another session is not held back
    for h in hanging:
        h.join()  # the engine timeout ends them (504)
    assert post(proxy, "busy", chat("after")).status_code == 200  # the session's slots came back
    refused = [r for r in proxy.records("busy") if r["error"] and "in flight" in r["error"]]
    assert len(refused) == len(APIS)


def test_request_bytes_per_session_per_minute_are_capped(proxy_of):
    proxy = proxy_of("--set", "polar_session_bytes_per_minute=300000")
    body = chat("hi", metadata={"note": "y" * 100_000})
    assert [post(proxy, "heavy", body).status_code for _ in range(3)] == [200, 200, 429]
    r = post(proxy, "heavy", body)
    assert r.status_code == 429 and r.json()["error"]["type"] == "rate_limit_error"
    assert "polar_session_bytes_per_minute" in r.json()["error"]["message"]
    assert post(proxy, "light", body).status_code == 200  # the quota is the session's, not the proxy's
    records = proxy.records("heavy")
    assert len(records) == 4 and [bool(r["error"]) for r in records] == [False, False, True, True]
    assert records[-1]["request"]["polar_refused_body"]["bytes"] > 100_000  # never parsed, kept as a head


def rss_mb(pid: int) -> float:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def hang_up(proxy, key: str, body: bytes) -> None:
    """Send a streamed call and leave at once, before the proxy has routed it to its stream relay."""
    port = int(proxy.base_url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: polar\r\nauthorization: Bearer " + key.encode()
                  + b"\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(body) + body)


def wait_recorded(proxy, key: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not proxy.records(key):
        assert time.monotonic() < deadline, f"no record of {key} after {timeout_s:.0f} s"
        time.sleep(0.02)


def test_streamed_calls_whose_clients_hang_up_are_not_kept(proxy_of):
    proxy = proxy_of()
    body = json.dumps(chat("hello", stream=True, metadata={"note": "z" * 800_000})).encode()
    assert post(proxy, "warm", chat("hi")).status_code == 200
    rss = [rss_mb(proxy.pid)]
    for n in range(3):  # a call held after its client left would add ~50 MB a round
        for i in range(60):
            hang_up(proxy, f"gone-{n}-{i}", body)
            # one at a time, however busy the machine: what stays is what leaked, not a burst's high-water mark
            wait_recorded(proxy, f"gone-{n}-{i}")
        time.sleep(2)
        rss.append(rss_mb(proxy.pid))
    print("proxy RSS (MB) before and after each round of 60 hang-ups:", [round(m) for m in rss])
    for n in range(3):
        for i in range(60):
            (record,) = proxy.records(f"gone-{n}-{i}")  # each call once: answered, or recorded as left
            assert record["error"] in (None, "client disconnected")
    assert rss[-1] - rss[1] < 20, rss  # was +47 MB a round: the relay kept every such call and its body
