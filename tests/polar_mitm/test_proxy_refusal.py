"""What the proxy refuses, and how: no upstream connection, the provider's own error shape, and a record."""
from __future__ import annotations

import json

import httpx
import pytest

from polar_mitm.launch import stop
from polar_mitm.sessions.registry import register_session
from tests.polar_mitm.conftest import CountingListener, free_port, start_proxy
from tests.redis_server import redis_server


def test_connect_to_other_hosts_is_refused_before_any_connection(proxy):
    target = CountingListener()
    with pytest.raises(httpx.ProxyError, match="403"):
        httpx.get(f"https://127.0.0.1:{target.port}/", proxy=proxy.proxy_url(), verify=False)
    # absolute-form plain HTTP skips CONNECT: refused in the request hook as well
    r = httpx.get(f"http://127.0.0.1:{target.port}/v1/chat/completions", proxy=proxy.proxy_url())
    assert r.status_code == 403
    assert target.accepted_before_now() == 0


def test_non_llm_paths_on_provider_hosts_get_the_providers_403(proxy):
    with proxy.proxied_client() as client:
        r = client.get("https://api.anthropic.com/api/claude_code/settings")
        assert r.status_code == 403 and r.json()["type"] == "error" and r.json()["error"]["type"] == "permission_error"
        r = client.post("https://api.openai.com/v1/files", json={})
        assert r.status_code == 403 and "message" in r.json()["error"]
    r = httpx.post(proxy.base_url + "/v1/embeddings", json={}, headers={"authorization": "Bearer k"})
    assert r.status_code == 403


def test_websocket_upgrade_is_refused(proxy):
    headers = {"upgrade": "websocket", "connection": "Upgrade", "sec-websocket-version": "13",
               "sec-websocket-key": "dGhlIHNhbXBsZSBub25jZQ==", "authorization": "Bearer k"}
    with proxy.proxied_client() as client:
        assert client.get("https://api.openai.com/v1/responses", headers=headers).status_code == 403


@pytest.mark.parametrize(
    "path,headers,check",
    [
        ("/v1/chat/completions", {"authorization": "Bearer bad-json"}, lambda b: b["error"]["type"] == "invalid_request_error"),
        ("/v1/responses", {"authorization": "Bearer bad-json"}, lambda b: "message" in b["error"]),
        ("/v1/messages", {"x-api-key": "bad-json"}, lambda b: b["type"] == "error"),
        ("/v1beta/models/tiny:generateContent", {"x-goog-api-key": "bad-json"},
         lambda b: b["error"]["status"] == "INVALID_ARGUMENT"),
    ],
)
def test_malformed_bodies_get_the_provider_error_shape_and_a_record(proxy, path, headers, check):
    r = httpx.post(proxy.base_url + path, content=b"{not json", headers=headers)
    assert r.status_code == 400 and check(r.json())
    r = httpx.post(proxy.base_url + path, json={"messages": "nope", "contents": 3, "input": 5}, headers=headers)
    assert r.status_code == 400 and check(r.json())
    records = proxy.records("bad-json")
    assert records and all(rec["error"] for rec in records) and records[-1]["output_ids"] == []


def test_oversize_prompt_is_a_context_length_error(proxy):
    huge = "word " * 6000  # far past the tiny model's 4096-token context
    r = httpx.post(proxy.base_url + "/v1/chat/completions", headers={"authorization": "Bearer big"},
                   json={"model": "tiny", "messages": [{"role": "user", "content": huge}]})
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    assert "context" in proxy.records("big")[-1]["error"]


def test_side_endpoints_answer_locally(proxy):
    r = httpx.get(proxy.base_url + "/v1/models", headers={"authorization": "Bearer k"})
    assert r.status_code == 200 and r.json()["data"][0]["id"]
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hello there"}]}
    r = httpx.post(proxy.base_url + "/v1/messages/count_tokens", json=body, headers={"x-api-key": "k"})
    assert r.status_code == 200 and r.json()["input_tokens"] > 3
    r = httpx.post(proxy.base_url + "/v1beta/models/tiny:countTokens", headers={"x-goog-api-key": "k"},
                   json={"contents": [{"role": "user", "parts": [{"text": "hello there"}]}]})
    assert r.status_code == 200 and r.json()["totalTokens"] > 3
    r = httpx.get(proxy.base_url + "/v1beta/models/tiny", headers={"x-goog-api-key": "k"})
    assert r.status_code == 200 and r.json()["name"] == "models/tiny"


def test_engine_down_gives_the_providers_5xx_and_a_record(tmp_path, tiny_model_dir):
    dead = f"http://127.0.0.1:{free_port()}"
    proc, proxy = start_proxy(tmp_path, dead, tiny_model_dir)
    try:
        r = httpx.post(proxy.base_url + "/v1/messages", headers={"x-api-key": "down"},
                       json={"model": "tiny", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 503 and r.json()["type"] == "error"
        (record,) = proxy.records("down")
        assert "unreachable" in record["error"] and record["output_ids"] == []
        # the proxy keeps serving
        assert httpx.get(proxy.base_url + "/v1/models", headers={"authorization": "Bearer k"}).status_code == 200
    finally:
        stop(proc)


def test_registered_sessions_only_when_not_open(tmp_path, reference_server, tiny_model_dir):
    with redis_server(tmp_path) as redis_url:
        proc, proxy = start_proxy(tmp_path, reference_server, tiny_model_dir, "--set", f"polar_sessions={redis_url}")
        try:
            token = register_session(redis_url, "task-9", "run-1")
            body = {"model": "tiny", "max_tokens": 4, "temperature": 0, "messages": [{"role": "user", "content": "hi"}]}
            # base URL: the token is the API key
            assert httpx.post(proxy.base_url + "/v1/chat/completions", json=body,
                              headers={"authorization": "Bearer nope"}).status_code == 401
            ok = httpx.post(proxy.base_url + "/v1/chat/completions", json=body,
                            headers={"authorization": f"Bearer {token}"})
            assert ok.status_code == 200
            # proxy mode: session and token in HTTPS_PROXY; a wrong pair never gets a tunnel
            with pytest.raises(httpx.ProxyError, match="407"):
                httpx.post("https://api.openai.com/v1/chat/completions", json=body,
                           proxy=proxy.proxy_url("run-1", "wrong"), verify=str(proxy.ca_cert))
            with pytest.raises(httpx.ProxyError, match="407"):
                httpx.post("https://api.openai.com/v1/chat/completions", json=body,
                           proxy=proxy.proxy_url("run-2", token), verify=str(proxy.ca_cert))
            ok = httpx.post("https://api.openai.com/v1/chat/completions", json=body,
                            proxy=proxy.proxy_url("run-1", token), verify=str(proxy.ca_cert))
            assert ok.status_code == 200
            records = proxy.records("run-1", task="task-9")
            assert len(records) == 2 and all(r["error"] is None for r in records)
            assert token not in json.dumps(records)
        finally:
            stop(proc)


def test_vllm_engine_mode_records_the_engines_tokens(tmp_path, reference_server, tiny_model_dir):
    proc, proxy = start_proxy(tmp_path, reference_server, tiny_model_dir, "--set", "polar_engine=vllm")
    try:
        body = {"model": "tiny", "max_tokens": 6, "temperature": 0, "messages": [{"role": "user", "content": "hi"}]}
        for stream in (False, True):
            r = httpx.post(proxy.base_url + "/v1/chat/completions", json={**body, "stream": stream},
                           headers={"authorization": "Bearer v"})
            assert r.status_code == 200
        plain, streamed = proxy.records("v")
        direct = httpx.post(reference_server + "/v1/completions", json={
            "prompt": plain["prompt_ids"], "max_tokens": 6, "temperature": 0, "logprobs": 1,
            "return_token_ids": True}).json()["choices"][0]
        assert plain["output_ids"] == streamed["output_ids"] == direct["token_ids"]
        assert plain["output_logprobs"] == pytest.approx(direct["logprobs"]["token_logprobs"], abs=1e-6)
    finally:
        stop(proc)


def test_a_long_prompt_with_the_engine_down_names_the_engine(tmp_path, tiny_model_dir):
    """No engine ever answered, so none said its context: a prompt past the model config's 4096 tokens is the
    engine's failure, not a context error (a Codex run against a stopped engine reported "prompt is 17550
    tokens; the model's context is 4096 tokens" and sent the user to --context-length)."""
    from polar_mitm.launch import free_port, proxy_process

    dead = f"http://127.0.0.1:{free_port()}"
    with proxy_process(tmp_path, dead, tiny_model_dir) as proxy:
        r = httpx.post(proxy.base_url + "/v1/chat/completions", headers={"authorization": "Bearer down"},
                       json={"model": "tiny", "messages": [{"role": "user", "content": "word " * 6000}]}, timeout=60)
    error = r.json()["error"]
    assert r.status_code == 503 and error["message"].startswith(f"polar: the inference engine is unreachable: {dead}")
    assert "the model's context is 4096 tokens" in error["message"], error
