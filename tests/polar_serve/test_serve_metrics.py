"""GET /metrics: the counters a load balancer or a bench reads (requests, prompt tokens, cached prompt tokens)."""
from __future__ import annotations

import httpx


def counters(url: str) -> dict[str, int]:
    text = httpx.get(url + "/metrics", timeout=30).text
    return {name: int(value) for name, value in
            (line.split() for line in text.splitlines() if line and not line.startswith("#"))}


def generate(url: str, ids: list[int]) -> dict:
    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": 4, "temperature": 0}, "return_logprob": True}
    return httpx.post(url + "/generate", json=body, timeout=60).json()


def test_metrics_count_prompt_and_cached_tokens(reference_server):
    before = counters(reference_server)
    prompt = [(i * 7) % 900 + 10 for i in range(300)]
    first = generate(reference_server, prompt)
    second = generate(reference_server, prompt + first["output_ids"] + [11, 12, 13])
    after = counters(reference_server)
    assert after["polar_serve_requests_total"] - before["polar_serve_requests_total"] == 2
    assert after["polar_serve_prompt_tokens_total"] - before["polar_serve_prompt_tokens_total"] == (
        first["meta_info"]["prompt_tokens"] + second["meta_info"]["prompt_tokens"])
    cached = after["polar_serve_cached_tokens_total"] - before["polar_serve_cached_tokens_total"]
    assert cached == first["meta_info"]["cached_tokens"] + second["meta_info"]["cached_tokens"]
    assert second["meta_info"]["cached_tokens"] > 0  # the second prompt extends the first's prompt and output
