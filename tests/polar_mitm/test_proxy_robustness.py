"""What any input does to the proxy (issue 8): text that is not valid Unicode is answered and recorded
exactly, fuzzed requests get only documented answers, slow or dying engines end in the provider's error
and a record, a template that drops the tools is flagged, and 25 times the session cap do not grow memory unbounded."""
from __future__ import annotations

import asyncio
import json
import shutil
import time

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from polar_mitm.launch import stop
from polar_mitm.sessions.registry import hashed_id
from tests.polar_mitm.conftest import start_proxy
from tests.polar_mitm.provider_requests import APIS, is_provider_error, provider_request, send, stream_error
from tests.polar_mitm.stub_engine import StubEngine

LONE_SURROGATE = "tool said \udcff here"


def raw_json(body: dict) -> bytes:
    """JSON as node's JSON.stringify writes a broken string: the lone surrogate as a \\u escape."""
    return json.dumps(body, ensure_ascii=True).encode()


@pytest.mark.parametrize("api", APIS)
def test_a_lone_surrogate_is_answered_and_recorded_exactly(proxy, api):
    key = f"surrogate-{api}"
    req = provider_request(api, LONE_SURROGATE, stream=False, key=key)
    r = send(proxy, req, "base_url", raw_body=raw_json(req.body))
    assert r.status_code == 200, r.text
    (record,) = proxy.records(key)
    assert record["error"] is None and record["output_ids"]
    assert record["request"] == json.loads(raw_json(req.body))  # the same strings, surrogate included
    line = (proxy.capture_dir / "local" / f"{hashed_id(key)}.jsonl").read_bytes()
    line.decode("utf-8")  # valid UTF-8 on disk


# -- fuzz: mutated provider requests through the running proxy ------------------------------------------------
json_leaf = st.one_of(st.none(), st.booleans(), st.integers(-5, 10**6), st.floats(allow_nan=False),
                      st.text(max_size=30))
json_value = st.recursive(json_leaf, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                              st.dictionaries(st.text(max_size=8), inner, max_size=4)),
                          max_leaves=12)


def mutate(body: dict, path: list, value) -> dict:
    """Replace (or add) one field, at any depth the path reaches."""
    body = json.loads(json.dumps(body))
    node = body
    for step in path[:-1]:
        if isinstance(node, dict) and node:
            node = node[sorted(node)[step % len(node)]]
        elif isinstance(node, list) and node:
            node = node[step % len(node)]
    if isinstance(node, dict):
        keys = sorted(node) + ["extra"]
        node[keys[path[-1] % len(keys)]] = value
    elif isinstance(node, list) and node:
        node[path[-1] % len(node)] = value
    return body


DOCUMENTED = {200, 400, 413}


@settings(max_examples=48, deadline=None, suppress_health_check=list(HealthCheck))
@given(api=st.sampled_from(APIS), stream=st.booleans(), path=st.lists(st.integers(0, 50), min_size=1, max_size=4),
       value=json_value)
def test_fuzzed_requests_get_documented_answers(proxy, api, stream, path, value):
    req = provider_request(api, "hi", stream, key="fuzz", max_tokens=3)
    body = mutate(req.body, path, value)
    r = httpx.post(proxy.base_url + req.path, content=json.dumps(body).encode(),
                   headers={**req.headers, "content-type": "application/json"}, timeout=60)
    assert r.status_code in DOCUMENTED, r.text[:300]
    if r.status_code != 200:
        assert is_provider_error(api, r.json())
    elif r.headers.get("content-type", "").startswith("text/event-stream"):
        assert stream_error(api, r.text) is None or "context" in r.text
    assert "Traceback" not in proxy.log.read_text()


# -- engines that hang or die ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def stub(tiny_model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    return StubEngine(tok.encode("fine, thanks", add_special_tokens=False) + [tok.convert_tokens_to_ids("<|im_end|>")])


@pytest.fixture(scope="module")
def stub_proxy(tmp_path_factory, stub, tiny_model_dir):
    proc, handle = start_proxy(tmp_path_factory.mktemp("stubproxy"), stub.url, tiny_model_dir,
                               "--set", "polar_engine_timeout=3", "--set", "polar_engine_first_byte_timeout=2")
    yield handle
    stop(proc)


@pytest.mark.parametrize("stream", [False, True])
def test_a_hanging_engine_times_out_in_the_providers_shape(stub, stub_proxy, stream):
    stub.mode = "hang"
    try:
        for api in APIS:
            key = f"hang-{api}-{stream}"
            r = send(stub_proxy, provider_request(api, "hi", stream, key=key), "base_url")
            assert r.status_code == 504 and is_provider_error(api, r.json()), r.text[:300]
            (record,) = stub_proxy.records(key)
            assert record["error"].startswith("polar: engine timeout after")
    finally:
        stub.mode = "ok"


def test_an_engine_that_dies_mid_stream_ends_with_the_error_event_and_a_truncated_record(stub, stub_proxy):
    stub.mode = "die"
    try:
        for api in APIS:
            key = f"die-{api}"
            r = send(stub_proxy, provider_request(api, "hi", True, key=key), "base_url")
            assert r.status_code == 200 and stream_error(api, r.text), r.text[-300:]
            (record,) = stub_proxy.records(key)
            assert record["error"] and "truncated" in record["flags"]
            assert record["output_ids"] == stub.ids[:2]  # the tokens received before the engine died
    finally:
        stub.mode = "ok"


def test_streams_carry_only_provider_like_headers(stub_proxy):
    r = send(stub_proxy, provider_request("openai_chat", "hi", True, key="headers"), "base_url")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    assert not {"server", "date"} & {k.lower() for k in r.headers}


def test_a_client_that_disconnects_is_recorded_as_such(stub, stub_proxy):
    stub.mode = "hang"
    try:
        req = provider_request("openai_chat", "hi", True, key="leaver")
        with pytest.raises(httpx.ReadTimeout):
            send(stub_proxy, req, "base_url", timeout=1.0)
        deadline = time.monotonic() + 30
        while not stub_proxy.records("leaver") and time.monotonic() < deadline:
            time.sleep(0.2)
        (record,) = stub_proxy.records("leaver")
        assert record["error"] in ("client disconnected", "polar: engine timeout after 2 s waiting for the first byte")
    finally:
        stub.mode = "ok"


def test_clients_that_leave_mid_stream_are_recorded_once(stub, stub_proxy):
    """Harnesses killed mid-stream (an agent timeout) while the engine streams on: the proxy notices the
    disconnect (the error hook) while its relay may still be finishing the call. Each call has one record,
    never two lines with one call_id (readers refuse those, and the sample lost its trajectories)."""
    ids = stub.ids
    stub.ids = ids[:-1] * 40 + ids[-1:]  # a long stream, so the client leaves at many different points
    try:
        for n in range(40):
            req = provider_request("openai_chat", "hi", True, key=f"killed-{n}")
            headers = {**req.headers, "content-type": "application/json"}
            with httpx.stream("POST", stub_proxy.base_url + req.path, json=req.body, headers=headers, timeout=30) as r:
                assert r.status_code == 200
                chunks = r.iter_raw()
                for _ in range(n % 6):
                    next(chunks, None)
        time.sleep(2)  # the relay's last writes
        for n in range(40):
            records = stub_proxy.records(f"killed-{n}")
            assert len(records) == 1, [(r["call_id"], r["error"]) for r in records]
            assert records[0]["error"] in (None, "client disconnected")  # None: finished before the proxy noticed
    finally:
        stub.ids = ids


# -- a chat template that never shows the model its tools -------------------------------------------------------
def test_tools_the_template_drops_are_flagged(tmp_path, reference_server, tiny_model_dir):
    model = tmp_path / "plain-template"
    shutil.copytree(tiny_model_dir, model)
    (model / "chat_template.jinja").write_text(
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    proc, proxy = start_proxy(tmp_path / "p", reference_server, model, quiet=False)
    try:
        body = {"model": "tiny", "max_tokens": 3, "messages": [{"role": "user", "content": "list files"}],
                "tools": [{"type": "function", "function": {"name": "shell", "parameters": {"type": "object"}}}]}
        r = httpx.post(proxy.base_url + "/v1/chat/completions", json=body, headers={"authorization": "Bearer t"})
        assert r.status_code == 200
        (record,) = proxy.records("t")
        assert "template_dropped_tools" in record["flags"]
        assert "drops template_dropped_tools" in proxy.log.read_text() and str(model) in proxy.log.read_text()
    finally:
        stop(proc)


# -- memory: many short sessions ------------------------------------------------------------------------------
def rss_kb(pid: int) -> int:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


async def many_sessions(base_url: str, first: int, count: int, concurrency: int = 16) -> None:
    import aiohttp

    queue = iter(range(first, first + count))
    body = json.dumps({"model": "tiny", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}).encode()

    async def worker(http: aiohttp.ClientSession) -> None:
        for n in queue:
            async with http.post(base_url + "/v1/chat/completions", data=body,
                                 headers={"authorization": f"Bearer m-{n}", "content-type": "application/json"}) as r:
                assert r.status == 200, await r.text()
                await r.read()

    async with aiohttp.ClientSession() as http:
        await asyncio.gather(*(worker(http) for _ in range(concurrency)))


def test_sessions_past_the_cap_keep_memory_bounded(tmp_path, stub, tiny_model_dir):
    """25 times the session cap go through after a warm-up: RSS grows by less than 1.6 KB per session (a leak of
    a session's history, ids or capture state would be many times that). Measured with this cap: RSS rises ~3-4
    MB per 1,000 sessions up to ~4,000 (caches, allocator), then ~0.5 MB per 1,000."""
    proc, proxy = start_proxy(tmp_path, stub.url, tiny_model_dir, "--set", "polar_max_sessions=200")
    try:
        asyncio.run(many_sessions(proxy.base_url, 0, 4000))  # warm up: caches, allocator, the LRU filled
        settled = rss_kb(proc.pid)
        asyncio.run(many_sessions(proxy.base_url, 4000, 5000))
        grown_mb = (rss_kb(proc.pid) - settled) / 1024
        print(f"proxy RSS growth over 5,000 more sessions: {grown_mb:.1f} MB")
        assert grown_mb < 8, f"RSS grew {grown_mb:.1f} MB"
    finally:
        stop(proc)
