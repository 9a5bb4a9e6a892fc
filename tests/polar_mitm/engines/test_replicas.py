"""Several engine replicas behind one proxy: sessions stick to one replica, a replica that dies hands its sessions
to another without an error the harness sees, a replica that comes back takes new sessions, and proxies that
share Redis agree on placement. Real reference servers (echo policy) and real mitmdump, all on 127.0.0.1."""
from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from polar_mitm.sessions.registry import hashed_id, register_session, unregister_session
from polar_traj.capture_reader import read_capture
from tests.polar_mitm.conftest import free_port, start_proxy, stop
from tests.redis_server import redis_server

ROOT = Path(__file__).resolve().parents[3]
ECHO = ROOT / "fixtures" / "policies" / "echo.yaml"


@dataclass
class Replica:
    """One `polar serve` on a fixed port, so that it can be killed and started again at the same URL."""

    model_dir: Path
    log: Path
    extra: tuple[str, ...] = ()
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        cmd = [sys.executable, "-m", "polar_serve", "serve", "--model", str(self.model_dir), "--host", "127.0.0.1",
               "--port", str(self.port), "--policy", str(ECHO), *self.extra]
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"polar serve did not start: {self.log.read_text()[-2000:]}")
            time.sleep(0.2)

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()


@pytest.fixture(scope="module")
def replicas(tmp_path_factory, tiny_model_dir):
    tmp = tmp_path_factory.mktemp("replicas")
    # A is slowed (50 ms a token) so that a stream can be caught mid-way; B runs at full speed.
    pair = [Replica(tiny_model_dir, tmp / "a.log", ("--step-delay-ms", "50")), Replica(tiny_model_dir, tmp / "b.log")]
    for r in pair:
        r.start()
    yield pair
    for r in pair:
        if r.proc and r.proc.poll() is None:
            r.proc.terminate()
            r.proc.wait(10)


def chat(text: str, stream: bool = False) -> dict:
    return {"model": "tiny", "messages": [{"role": "user", "content": text}], "max_tokens": 200,
            "temperature": 0, "stream": stream}


async def turn(client: httpx.AsyncClient, base: str, key: str, body: dict) -> dict:
    r = await client.post(base + "/v1/chat/completions", json=body, headers={"authorization": f"Bearer {key}"})
    assert r.status_code == 200, r.text
    message = r.json()["choices"][0]["message"]
    body["messages"] += [{"role": "assistant", "content": message["content"]},
                         {"role": "user", "content": f"and then {len(body['messages'])}"}]
    return body


async def run_sessions(base: str, names: list[str], turns: int, concurrency: int = 8) -> None:
    gate = asyncio.Semaphore(concurrency)

    async def one(name: str) -> None:
        async with gate:
            body = chat(f"hello from {name}")
            for _ in range(turns):
                body = await turn(client, base, name, body)

    async with httpx.AsyncClient(timeout=120) as client:
        await asyncio.gather(*(one(n) for n in names))


def records(proxy, name: str, task: str = "local") -> list:
    path = proxy.capture_dir / task / f"{hashed_id(name)}.jsonl"
    return list(read_capture(path)) if path.exists() else []


def replay(record) -> None:
    """The record's tokens are what the replica that served it computes for that prompt."""
    body = {"input_ids": list(record.prompt_ids), "return_logprob": True,
            "sampling_params": {"max_new_tokens": len(record.output_ids), "temperature": 0}}
    got = httpx.post(record.engine + "/generate", json=body, timeout=60).json()
    assert got["output_ids"] == list(record.output_ids), record.call_id
    assert [t[0] for t in got["meta_info"]["output_token_logprobs"]] == pytest.approx(record.output_logprobs, abs=1e-5)


def test_sessions_stick_to_one_replica_and_both_serve(tmp_path, replicas, tiny_model_dir):
    a, b = replicas
    proc, proxy = start_proxy(tmp_path, f"{a.url},{b.url}", tiny_model_dir)
    try:
        names = [f"sess-{i}" for i in range(40)]
        asyncio.run(run_sessions(proxy.base_url, names, turns=3))
        placed = Counter()
        for name in names:
            recs = records(proxy, name)
            assert len(recs) == 3 and all(r.error is None for r in recs), name
            assert len({r.engine for r in recs}) == 1, f"{name} was served by {[r.engine for r in recs]}"
            assert [r.prefix_source for r in recs[1:]] == ["substituted", "substituted"]
            placed[recs[0].engine] += 1
        # Least loaded: A takes 50 ms a token, so its calls stay in flight longer and B gets more new sessions.
        assert placed[b.url] > placed[a.url] >= 1, placed
    finally:
        stop(proc)


def _stream_until_first_token(base: str, key: str, body: dict, on_first) -> tuple[list[str], bool]:
    """Events of a streamed call; `on_first()` runs once content has arrived. Returns (events, clean end)."""
    events, fired = [], False
    with httpx.stream("POST", base + "/v1/chat/completions", json=body, timeout=120,
                      headers={"authorization": f"Bearer {key}"}) as r:
        assert r.status_code == 200
        try:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    events.append(line[6:])
                    if not fired and line[6:] != "[DONE]" and _content(json.loads(line[6:])):
                        fired = True
                        on_first()
        except httpx.HTTPError:
            return events, False
    return events, events[-1:] == ["[DONE]"] and not any('"error"' in e for e in events)


def _content(event: dict) -> str:
    return "".join((c.get("delta") or {}).get("content") or "" for c in event.get("choices") or [])


def test_failover_then_the_replica_comes_back(tmp_path, replicas, tiny_model_dir):
    a, b = replicas
    backends = f"{a.url},{b.url}"
    # P1 never probes after its start: calls find the dead replica themselves (the retry path).
    # P2 probes every second: it notices the death and the return.
    p1_proc, p1 = start_proxy(tmp_path / "p1", backends, tiny_model_dir, "--set", "polar_engine_probe_interval=3600",
                              quiet=False)
    p2_proc, p2 = start_proxy(tmp_path / "p2", backends, tiny_model_dir, "--set", "polar_engine_probe_interval=1",
                              "--set", "polar_engine_status_interval=1", quiet=False)
    try:
        names = [f"fo-{i}" for i in range(8)]
        asyncio.run(run_sessions(p1.base_url, names, turns=1))
        first = {n: records(p1, n)[0].engine for n in names}
        assert set(first.values()) == {a.url, b.url}, first

        # A stream on A (P2's first session goes to the first replica: nothing is placed yet), killed mid-way.
        asyncio.run(run_sessions(p2.base_url, ["st-0"], turns=1))
        assert records(p2, "st-0")[0].engine == a.url
        body = chat("hello from st-0")
        body["messages"] = [*body["messages"], {"role": "assistant", "content": "You said: hello from st-0"},
                            {"role": "user", "content": " ".join(f"word{i}" for i in range(60))}]
        body["stream"] = True
        events, clean = _stream_until_first_token(p2.base_url, "st-0", body, a.kill)
        assert not clean, "a stream whose engine died must not end as a complete reply"
        streamed = records(p2, "st-0")
        assert len(streamed) == 2, "a call that had started streaming is not retried"
        assert streamed[1].engine == a.url and streamed[1].error and streamed[1].output_ids

        # Every later call of A's sessions succeeds on B, rendered in full and labelled; B's sessions go on.
        # The first of them streams: its stream opens on B after A refused the connection.
        streamed_first = next(n for n in names if first[n] == a.url)
        asyncio.run(asyncio.wait_for(_second_turns(p1.base_url, names, streamed_first), 300))
        for name in names:
            second = records(p1, name)[1]
            assert second.error is None and second.engine == b.url
            want = "rendered:engine_moved" if first[name] == a.url else "substituted"
            assert second.prefix_source == want, (name, second.prefix_source)
        assert "failed before generating; retried on" in p1.log.read_text()
        assert "is down" in p2.log.read_text()

        # A comes back at the same URL: P2's probe sees it and new sessions reach it again.
        a.start()
        deadline = time.monotonic() + 30
        while "is up again" not in p2.log.read_text():
            assert time.monotonic() < deadline, p2.log.read_text()[-2000:]
            time.sleep(0.2)
        fresh = [f"new-{i}" for i in range(4)]
        asyncio.run(run_sessions(p2.base_url, fresh, turns=1, concurrency=1))
        assert a.url in {records(p2, n)[0].engine for n in fresh}
        # the periodic status line: each replica's state, calls in flight, sessions and calls served
        status = [line for line in p2.log.read_text().splitlines() if "polar: engines: " in line]
        assert any(f"{b.url} up inflight=0 sessions=" in line for line in status), status[-3:]
        assert any(f"{a.url} down (" in line for line in status), status[-3:]

        # Tokens exact: each record replayed on the replica that served it (A again has the same weights).
        for name in names:
            for record in records(p1, name):
                replay(record)
    finally:
        stop(p1_proc)
        stop(p2_proc)


async def _second_turns(base: str, names: list[str], streamed: str) -> None:
    async with httpx.AsyncClient(timeout=120) as client:
        for name in [streamed, *(n for n in names if n != streamed)]:
            body = chat(f"hello from {name}", stream=name == streamed)
            body["messages"] += [{"role": "assistant", "content": f"You said: hello from {name}"},
                                 {"role": "user", "content": "and then 2"}]
            if name != streamed:
                await turn(client, base, name, body)
                continue
            async with client.stream("POST", base + "/v1/chat/completions", json=body,
                                     headers={"authorization": f"Bearer {name}"}) as r:
                events = [line[6:] async for line in r.aiter_lines() if line.startswith("data: ")]
            assert r.status_code == 200 and events[-1] == "[DONE]", events[-3:]
            text = "".join(_content(json.loads(e)) for e in events[:-1])
            assert not any('"error"' in e for e in events) and text == "You said: and then 2", text


def test_proxies_sharing_redis_agree_on_placement(tmp_path, replicas, tiny_model_dir):
    a, b = replicas
    if a.proc.poll() is not None:
        a.start()
    with redis_server(tmp_path) as url:
        extra = ("--set", f"polar_sessions={url}")
        x_proc, x = start_proxy(tmp_path / "x", f"{a.url},{b.url}", tiny_model_dir, *extra)
        # Y lists the replicas the other way round: left alone it would place differently.
        y_proc, y = start_proxy(tmp_path / "y", f"{b.url},{a.url}", tiny_model_dir, *extra)
        try:
            tokens = {f"r-{i}": register_session(url, "t1", f"r-{i}") for i in range(6)}

            async def both() -> None:
                async with httpx.AsyncClient(timeout=120) as client:
                    for sid, token in tokens.items():
                        body = await turn(client, x.base_url, token, chat(f"hello from {sid}"))
                        await turn(client, y.base_url, token, body)

            asyncio.run(both())
            engines = Counter()
            for sid in tokens:
                first, second = (list(read_capture(p.capture_dir / "t1" / f"{sid}.jsonl"))[0] for p in (x, y))
                assert first.engine == second.engine, sid
                engines[first.engine] += 1
            import redis

            stored = redis.Redis.from_url(url).get("polar:engine:t1/r-0")
            assert stored is not None and stored.decode() == next(read_capture(x.capture_dir / "t1" / "r-0.jsonl")).engine
            assert set(engines) == {a.url, b.url}, engines
            unregister_session(url, tokens["r-0"])  # an ended session's placement goes with it
            assert redis.Redis.from_url(url).get("polar:engine:t1/r-0") is None
        finally:
            stop(x_proc)
            stop(y_proc)
