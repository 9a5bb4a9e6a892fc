"""`polar api`'s bounds and refusals (issue 41), against a real `polar api` on 127.0.0.1 and its own real Redis,
with no node: streams shared and capped, tokens of any bytes, no secret in the log, callback URLs refused at
submit, results and reports holding names that are not UTF-8."""
from __future__ import annotations

import asyncio
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator
from urllib.parse import urlsplit

import httpx
import pytest
import redis

from tests.workers.api.test_api import COIN, TOKEN, start_api, stop_api
from workers.manifest import read_manifest, result_path, write_json

MAX_STREAMS = 250


@dataclass
class Api:
    url: str
    root: Path
    redis_url: str
    log: Path

    def http(self, **headers: str) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers={"authorization": f"Bearer {TOKEN}", **headers}, timeout=30)


@pytest.fixture(scope="module")
def api(tmp_path_factory, redis_base: str) -> Iterator[Api]:
    root = tmp_path_factory.mktemp("api-limits")
    log = root / "api.log"
    proc, url = start_api(root, redis_base + "/1", redis_base + "/0", log, "--max-streams", str(MAX_STREAMS))
    try:
        yield Api(url, root, redis_base + "/1", log)
    finally:
        stop_api(proc)


def raw_status(url: str, request: bytes) -> int:
    """Send `request` as is (bytes no HTTP client would let through) and return the answer's status."""
    parts = urlsplit(url)
    with socket.create_connection((parts.hostname, parts.port), timeout=10) as s:
        s.sendall(request)
        answer = b""
        while b"\r\n" not in answer:
            chunk = s.recv(4096)
            if not chunk:
                break
            answer += chunk
    return int(answer.split(b" ", 2)[1])


def test_bad_tokens_of_any_bytes_are_401(api: Api):
    """Before: a non-ASCII or invalid-UTF-8 token in a header, cookie or ?token= was an unhandled 500."""
    host = urlsplit(api.url).netloc.encode()
    cases = [b"GET /rollout/status HTTP/1.1\r\nAuthorization: Bearer caf\xc3\xa9-caf\xc3\xa9-caf\xc3\xa9\r\n",
             b"GET /rollout/status HTTP/1.1\r\nAuthorization: Bearer \xff\xfe\xfd\r\n",
             b"GET /rollout/status HTTP/1.1\r\nAuthorization: \xff\r\n",
             b"GET /rollout/status HTTP/1.1\r\nCookie: polar_token=\xff\xfe\r\n",
             b"GET /rollout/status HTTP/1.1\r\nCookie: polar_token=caf\xc3\xa9; other=\xe9\r\n",
             b"GET /?token=%FF%FE%C3%A9 HTTP/1.1\r\n", b"GET /?token=caf%C3%A9 HTTP/1.1\r\n",
             b"GET /rollout/status?token=%FF HTTP/1.1\r\n"]
    for request in cases:
        assert raw_status(api.url, request + b"Host: " + host + b"\r\nConnection: close\r\n\r\n") == 401, request
    assert "Traceback" not in api.log.read_text(errors="replace")


def test_query_token_only_on_the_dashboard_and_never_logged(api: Api):
    """Before: ?token= opened every endpoint, and the access log kept it (`GET /?token=… HTTP/1.1`)."""
    with httpx.Client(base_url=api.url, timeout=30) as c:
        for path in ("/rollout/status", "/metrics", "/api/batches/x/results", "/policy"):
            assert c.get(path, params={"token": TOKEN}).status_code == 401, path
        page = c.get("/", params={"token": TOKEN})
        assert page.status_code == 200 and "polar_token" in page.headers["set-cookie"]
        assert c.get("/rollout/status").status_code == 200  # the page's own requests carry the cookie
    time.sleep(0.5)
    log = api.log.read_text(errors="replace")
    assert '"GET /?<redacted> HTTP/1.1" 200' in log, log[-2000:]
    assert TOKEN not in log


def test_callback_urls_refused_at_submit(api: Api):
    """Before: any http(s) URL was taken, the cloud metadata address included."""
    refused = ["http://169.254.169.254/latest/meta-data/", "http://[fe80::1]:8000/polar", "http://10.0.0.1/polar",
               "http://192.168.1.10:8000/", "http://[::ffff:169.254.169.254]/", "http://metadata.google.internal/",
               "http://0x7f000001/polar", "http://2130706433/polar", "https://trainer.example.com/polar",
               "http://100.100.100.200/", "http://[fd00:ec2::254]/", "http://0.0.0.0:8000/"]
    with api.http() as c:
        for url in refused:
            answer = c.post("/api/tasks", json={"harness": "pi", "runtime": "bwrap", "group_size": 1,
                                                "task_id": "cb", **COIN, "callback_url": url})
            assert answer.status_code == 422, (url, answer.text)
            assert answer.json()["field"] == "callback_url" and answer.json()["error"].startswith("callback_url: ")
            assert "\n" not in answer.json()["error"]
        for url in ("http://127.0.0.1:9/polar", "http://localhost:9/polar", "http://[::1]:9/polar"):
            answer = c.post("/api/tasks", json={"harness": "pi", "runtime": "bwrap", "group_size": 1,
                                                "task_id": "cb", **COIN, "callback_url": url})
            assert answer.status_code == 201, (url, answer.text)
            c.post(f"/api/batches/{answer.json()['batch_id']}/cancel")


def test_results_and_report_with_a_name_that_is_not_utf8(api: Api):
    """Before: one sample whose agent left a non-UTF-8 file name made GET .../results a 500 for the whole batch."""
    with api.http() as c:
        answer = c.post("/api/tasks", json={"harness": "pi", "runtime": "bwrap", "group_size": 2, "task_id": "odd",
                                            **COIN})
        batch_id = answer.json()["batch_id"]
        manifest = read_manifest(api.root / "batches" / batch_id / "batch.json")
        odd = b"caf\xe9-\xff.txt".decode("utf-8", "surrogateescape")  # as os.listdir gives it
        first = manifest.samples[0].sample_id
        write_json(result_path(manifest, first), {  # what the worker's json.dumps writes for such a name
            "sample_id": first, "task_id": "odd", "status": "completed", "reward": 0.0, "failure": None,
            "tampered": [odd], "reason": f"dropped {odd}", "metadata": {odd: 1}})
        results = c.get(f"/api/batches/{batch_id}/results")
        assert results.status_code == 200, results.text
        [row] = results.json()
        assert row["tampered"] == ["caf\\udce9-\\udcff.txt"] and row["metadata"] == {"caf\\udce9-\\udcff.txt": 1}
        report = c.get(f"/api/batches/{batch_id}/report")
        assert report.status_code == 200, report.text[-2000:]
        c.post(f"/api/batches/{batch_id}/cancel")


def connected(r: redis.Redis) -> int:
    return int(r.info("clients")["connected_clients"])


def open_streams(api: Api) -> int:
    with api.http() as c:
        text = c.get("/metrics").text
    return int(next(line for line in text.splitlines() if line.startswith("polar_event_streams")).split()[1])


async def hold_streams(api: Api, n: int, held: asyncio.Event, release: asyncio.Event) -> list[int]:
    """`n` real SSE clients at once: each reads to its `hello` (or takes its refusal), then waits for `release`."""
    limits = httpx.Limits(max_connections=n + 10, max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=api.url, headers={"authorization": f"Bearer {TOKEN}"}, limits=limits,
                                 timeout=httpx.Timeout(60)) as client:
        ready = 0

        async def one() -> int:
            nonlocal ready
            async with client.stream("GET", "/events") as answer:
                lines = answer.aiter_lines()  # held: a dropped iterator, once collected, would close the stream
                if answer.status_code == 200:
                    async for line in lines:
                        if line.startswith("event: hello"):
                            break
                ready += 1
                if ready == n:
                    held.set()
                await release.wait()
                return answer.status_code

        return await asyncio.gather(*(one() for _ in range(n)))


def test_300_event_streams_share_redis_connections_and_get_429_over_the_cap(api: Api):
    """Before: 300 /events clients raised Redis connections from 5 to 110, and 22 stayed open after they left;
    none was refused."""
    r = redis.Redis.from_url(api.redis_url)
    with api.http() as c, c.stream("GET", "/events", timeout=httpx.Timeout(30)) as answer:  # warm: one heartbeat
        assert any(line.startswith("event: heartbeat") for line in answer.iter_lines())
    time.sleep(1.5)
    baseline = connected(r)
    during: list[int] = []

    async def run() -> list[int]:
        held, release = asyncio.Event(), asyncio.Event()
        task = asyncio.create_task(hold_streams(api, 300, held, release))
        await asyncio.wait_for(held.wait(), 120)
        for _ in range(3):  # across a heartbeat or two, all streams open
            during.append(connected(r))
            await asyncio.sleep(0.5)
        during.append(await asyncio.to_thread(open_streams, api))
        release.set()
        return await task

    started = time.monotonic()
    statuses = asyncio.run(run())
    assert sorted(set(statuses)) == [200, 429] and statuses.count(200) == MAX_STREAMS, (statuses.count(200), during)
    assert during[-1] == MAX_STREAMS
    assert max(during[:-1]) <= baseline + 1, (baseline, during)  # +1: a heartbeat's read beside the finisher's
    deadline = time.monotonic() + 15
    # The pool keeps the connection a heartbeat's read may have opened beside the finisher's (the +1 above).
    while open_streams(api) != 0 or connected(r) > baseline + 1:
        assert time.monotonic() < deadline, (open_streams(api), connected(r), baseline)
        time.sleep(0.3)
    with api.http() as c, c.stream("GET", "/events", timeout=httpx.Timeout(30)) as answer:
        assert answer.status_code == 200  # the slots were freed
    assert time.monotonic() - started < 60
