"""Sampling is the trainer's, not the agent's (polar_mitm/sessions/sampling.py): the plain functions, and the real
proxy in front of a recording stub engine with sessions in a real Redis: fixed sampling overrides what a request
asks for and is flagged; a session's call cap refuses the calls past it in the provider's error shape, each recorded."""
from __future__ import annotations

import httpx
import pytest

from polar_mitm.conversation import Sampling
from polar_mitm.launch import stop
from polar_mitm.sessions.registry import register_session, session_of, unregister_session
from polar_mitm.sessions.sampling import apply_fixed, parse_sampling, sampling_dict, session_sampling
from tests.polar_mitm.conftest import start_proxy
from tests.polar_mitm.provider_requests import HOSTS, is_provider_error, provider_request
from tests.polar_mitm.stub_engine import StubEngine
from tests.redis_server import redis_server


# -- plain functions --------------------------------------------------------------------------------------------
def test_parse_sampling_keeps_what_is_set():
    assert parse_sampling(None) is None and parse_sampling({}) is None
    assert parse_sampling({"temperature": None}) is None
    s = parse_sampling({"temperature": 1, "top_p": 0.9, "top_k": 20, "max_tokens": 64, "seed": 0})
    assert s == Sampling(max_tokens=64, temperature=1.0, top_p=0.9, top_k=20, seed=0)
    assert sampling_dict(s) == {"temperature": 1.0, "top_p": 0.9, "top_k": 20, "max_tokens": 64, "seed": 0}
    assert sampling_dict(None) is None


@pytest.mark.parametrize("data, message", [
    ({"temperature": -1}, "temperature: expected 0 or more"),
    ({"temperature": float("nan")}, "temperature: expected a finite number"),
    ({"temperature": "hot"}, "temperature: expected a finite number"),
    ({"top_p": 0}, r"top_p: expected a number in \(0, 1\]"),
    ({"top_p": 1.5}, "top_p"),
    ({"top_k": 0}, "top_k: expected a whole number >= 1"),
    ({"max_tokens": 2.5}, "max_tokens: expected a whole number"),
    ({"seed": -3}, "seed: expected a whole number >= 0"),
    ({"max_tokens": True}, "max_tokens"),
    ({"stop": ["x"], "temp": 1}, "unknown 'stop', 'temp'"),
    (["temperature"], "expected an object"),
])
def test_parse_sampling_refuses_with_the_key_named(data, message):
    with pytest.raises(ValueError, match=message):
        parse_sampling(data)


def test_apply_fixed_overrides_and_flags_only_what_the_request_asked_differently():
    asked = Sampling(max_tokens=100, temperature=50.0, top_p=0.5, stop=("END",))
    sent, flags = apply_fixed(asked, Sampling(temperature=0.7, top_p=0.5, top_k=20))
    assert sent == Sampling(max_tokens=100, temperature=0.7, top_p=0.5, top_k=20, stop=("END",))
    assert flags == ["sampling_override:temperature"]  # top_p asked as fixed; top_k not asked at all
    assert apply_fixed(asked, None) == (asked, [])


def test_a_fixed_seed_is_each_sessions_own_and_stable():
    fixed = Sampling(temperature=1.0, seed=7)
    a, b = session_sampling(fixed, "b1.t.0"), session_sampling(fixed, "b1.t.1")
    assert a.seed != b.seed and a == session_sampling(fixed, "b1.t.0") and 0 <= a.seed < 2 ** 31
    assert a.temperature == 1.0
    assert session_sampling(Sampling(temperature=1.0), "x") == Sampling(temperature=1.0)
    assert session_sampling(None, "x") is None


def test_session_of_refuses_corrupt_values():
    s = session_of({"task_id": "t", "session_id": "s", "sampling": {"temperature": 0.7}, "max_calls": 2})
    assert (s.sampling, s.max_calls) == (Sampling(temperature=0.7), 2)
    assert session_of({"task_id": "t", "session_id": "s"}).max_calls is None
    for bad in ({"max_calls": 0}, {"max_calls": "2"}, {"sampling": {"temperature": -1}}):
        with pytest.raises(ValueError):
            session_of({"task_id": "t", "session_id": "s", **bad})


# -- the real proxy ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def stub(tiny_model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    return StubEngine(tok.encode("fine", add_special_tokens=False) + [tok.convert_tokens_to_ids("<|im_end|>")])


@pytest.fixture(scope="module")
def redis_proxy(tmp_path_factory, stub, tiny_model_dir):
    tmp = tmp_path_factory.mktemp("sampling")
    with redis_server(tmp) as redis_url:
        proc, proxy = start_proxy(tmp, stub.url, tiny_model_dir, "--set", f"polar_sessions={redis_url}",
                                  quiet=False)
        try:
            yield redis_url, proxy
        finally:
            stop(proc)


def call(proxy, api: str, token: str, stream: bool = False, via: str = "base_url", session: str = "",
         **sampling) -> httpx.Response:
    req = provider_request(api, "hi", stream, key=token)
    body = {**req.body, **sampling}
    if via == "base_url":
        return httpx.post(proxy.base_url + req.path, json=body, headers=req.headers, timeout=60)
    with httpx.Client(proxy=proxy.proxy_url(session, token), verify=str(proxy.ca_cert), timeout=60) as client:
        return client.post(f"https://{HOSTS[api]}{req.path}", json=body, headers=req.headers)


def engine_params(stub: StubEngine, before: int) -> list[dict]:
    return [b["sampling_params"] for b in stub.bodies[before:]]


def test_fixed_temperature_overrides_an_agent_made_call_and_is_flagged(redis_proxy, stub):
    redis_url, proxy = redis_proxy
    token = register_session(redis_url, "task-s", "fixed-1", sampling=Sampling(temperature=0.7, max_tokens=5))
    before = len(stub.bodies)
    # the agent calls the proxy itself with its session's token, asking for temperature 50
    r = call(proxy, "openai_chat", token, temperature=50, max_tokens=4000)
    assert r.status_code == 200, r.text[:300]
    r = call(proxy, "anthropic", token, stream=True, via="https_proxy", session="fixed-1", temperature=50)
    assert r.status_code == 200 and "message_stop" in r.text
    sent = engine_params(stub, before)
    assert [(p["temperature"], p["max_new_tokens"]) for p in sent] == [(0.7, 5), (0.7, 5)]
    records = proxy.records("fixed-1", task="task-s")
    assert len(records) == 2 and all(rec["error"] is None for rec in records)
    assert records[0]["flags"] == ["sampling_override:temperature", "sampling_override:max_tokens"]
    assert records[1]["flags"] == ["sampling_override:temperature", "sampling_override:max_tokens"]
    assert records[0]["request"]["temperature"] == 50  # the request as received stays in the record


def test_unfixed_sampling_is_the_requests_own(redis_proxy, stub):
    redis_url, proxy = redis_proxy
    token = register_session(redis_url, "task-s", "free-1")
    before = len(stub.bodies)
    assert call(proxy, "openai_chat", token, temperature=50).status_code == 200
    (sent,) = engine_params(stub, before)
    assert sent["temperature"] == 50 and sent["max_new_tokens"] == 6
    (record,) = proxy.records("free-1", task="task-s")
    assert record["flags"] == [] and record["error"] is None


@pytest.mark.parametrize("api", ["openai_chat", "anthropic", "gemini"])
def test_calls_past_the_sessions_cap_are_refused_and_recorded(redis_proxy, stub, api):
    redis_url, proxy = redis_proxy
    session = f"capped-{api.replace('_', '-')}"
    token = register_session(redis_url, "task-s", session, max_calls=2)
    before = stub.requests
    assert call(proxy, api, token).status_code == 200
    assert call(proxy, api, token, via="https_proxy", session=session).status_code == 200
    r = call(proxy, api, token)
    assert r.status_code == 400 and is_provider_error(api, r.json()), r.text[:300]
    assert "max_calls" in r.text
    assert stub.requests == before + 2  # the refused call never reached the engine
    records = proxy.records(session, task="task-s")
    assert [rec["error"] is None for rec in records] == [True, True, False]
    assert "may make 2 LLM calls" in records[2]["error"] and records[2]["output_ids"] == []
    # the model list is no LLM call: not counted, not refused
    models = httpx.get(proxy.base_url + "/v1/models", headers={"authorization": f"Bearer {token}"}, timeout=30)
    assert models.status_code == 200
    assert "reached its cap of 2 LLM calls" in proxy.log.read_text()


def test_an_ended_session_forgets_its_count(redis_proxy):
    import redis

    redis_url, proxy = redis_proxy
    token = register_session(redis_url, "task-s", "ended-1", max_calls=5)
    assert call(proxy, "openai_chat", token).status_code == 200
    client = redis.Redis.from_url(redis_url)
    assert client.get("polar:calls:task-s/ended-1") == b"1"
    unregister_session(redis_url, token)
    assert client.get("polar:calls:task-s/ended-1") is None


def test_register_session_refuses_bad_values(redis_proxy):
    redis_url, _ = redis_proxy
    with pytest.raises(ValueError, match="max_calls"):
        register_session(redis_url, "task-s", "bad-1", max_calls=0)
