"""The reference server as a real process on 127.0.0.1, over real HTTP: its numbers equal a plain transformers
forward pass, both token APIs and their streams agree, scripted replies round-trip, weights reload, bad input
gets a 400, and concurrent and paused requests come out right."""
from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest
from tokenizers import Tokenizer

from polar_serve.launch import reference_server as launch

MESSAGES = [{"role": "system", "content": "You are a coding agent."},
            {"role": "user", "content": "Write polar.txt and tell me when you are done."}]


def post(base: str, path: str, body: Any, timeout: float = 30) -> httpx.Response:
    return httpx.post(base + path, json=body, timeout=timeout)


def events(base: str, path: str, body: dict, started: threading.Event | None = None) -> list[dict]:
    """The SSE `data:` payloads of a streamed request; asserts it ends with [DONE]. Sets `started` on the
    first payload."""
    out, done = [], False
    with httpx.stream("POST", base + path, json=body, timeout=30) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if started is not None and line.startswith("data: "):
                started.set()
            if line.startswith("data: "):
                assert not done, "data after [DONE]"
                if line == "data: [DONE]":
                    done = True
                else:
                    out.append(json.loads(line[6:]))
    assert done
    return out


def generate(base: str, ids: list[int], **sampling: Any) -> dict:
    r = post(base, "/generate", {"input_ids": ids, "sampling_params": sampling, "return_logprob": True})
    assert r.status_code == 200, r.text
    return r.json()


def triples(resp: dict) -> tuple[list[int], list[float]]:
    lps = resp["meta_info"]["output_token_logprobs"]
    assert [t for _, t, _ in lps] == resp["output_ids"]
    return resp["output_ids"], [lp for lp, _, _ in lps]


@pytest.fixture(scope="module")
def prompt(chat_ids) -> list[int]:
    return chat_ids(MESSAGES)


def test_generate_equals_a_forward_pass(reference_server: str, prompt: list[int], forward_logprobs, hf_model) -> None:
    resp = generate(reference_server, prompt, temperature=0, max_new_tokens=40)
    ids, lps = triples(resp)
    assert len(ids) > 5
    assert lps == pytest.approx(forward_logprobs(prompt, ids), abs=1e-5)
    import torch
    with torch.inference_mode():
        greedy = hf_model.generate(torch.tensor([prompt]), max_new_tokens=40, do_sample=False)[0, len(prompt):]
    assert ids == greedy.tolist()
    meta = resp["meta_info"]
    assert meta["prompt_tokens"] == len(prompt) and meta["completion_tokens"] == len(ids)
    assert meta["weight_version"] == "0" and meta["finish_reason"]["type"] in ("stop", "length")


def test_sampled_logprobs_are_the_raw_model_logprobs(reference_server: str, prompt: list[int],
                                                     forward_logprobs) -> None:
    a = generate(reference_server, prompt, temperature=0.7, top_k=20, top_p=0.9, seed=11, max_new_tokens=24)
    b = generate(reference_server, prompt, temperature=0.7, top_k=20, top_p=0.9, seed=11, max_new_tokens=24)
    c = generate(reference_server, prompt, temperature=1.5, seed=12, max_new_tokens=24)
    ids, lps = triples(a)
    assert a["output_ids"] == b["output_ids"] and a["output_ids"] != c["output_ids"]  # seeded = deterministic
    assert lps == pytest.approx(forward_logprobs(prompt, ids), abs=1e-5)  # not the tempered/top-k scores


def test_vllm_completions_carry_the_same_tokens(reference_server: str, prompt: list[int], hf_tokenizer) -> None:
    sg = generate(reference_server, prompt, temperature=0, max_new_tokens=16)
    r = post(reference_server, "/v1/completions", {"model": "x", "prompt": prompt, "max_tokens": 16,
                                                   "temperature": 0, "logprobs": 1, "return_token_ids": True})
    assert r.status_code == 200, r.text
    body = r.json()
    choice = body["choices"][0]
    assert choice["prompt_token_ids"] == prompt and choice["token_ids"] == sg["output_ids"]
    assert choice["logprobs"]["token_logprobs"] == [lp for lp, _, _ in sg["meta_info"]["output_token_logprobs"]]
    assert choice["text"] == sg["text"] and choice["finish_reason"] == sg["meta_info"]["finish_reason"]["type"]
    assert body["usage"] == {"prompt_tokens": len(prompt), "completion_tokens": len(sg["output_ids"]),
                             "total_tokens": len(prompt) + len(sg["output_ids"]),
                             "prompt_tokens_details": {"cached_tokens": 0}}  # shorter than one cached block
    assert len(choice["logprobs"]["top_logprobs"][0]) <= 2
    text_prompt = hf_tokenizer.decode(prompt)  # a text prompt is tokenized by the server
    r2 = post(reference_server, "/v1/completions", {"prompt": text_prompt, "max_tokens": 16, "temperature": 0,
                                                    "return_token_ids": True})
    assert r2.json()["choices"][0]["token_ids"] == sg["output_ids"]
    assert generate_text(reference_server, text_prompt)["output_ids"] == sg["output_ids"]


def generate_text(base: str, text: str) -> dict:
    return post(base, "/generate", {"text": text, "sampling_params": {"temperature": 0, "max_new_tokens": 16}}).json()


def test_streams_add_up_to_the_plain_responses(reference_server: str, prompt: list[int]) -> None:
    sampling: dict[str, Any] = {"temperature": 0.8, "seed": 5, "max_new_tokens": 30, "ignore_eos": True}
    free = generate(reference_server, prompt, **sampling)["text"]
    stop = free[2 * len(free) // 3:][:2]  # stops about two thirds in: exercises held-back text and trimming
    sampling["stop"] = [stop]
    whole = post(reference_server, "/generate", {"input_ids": prompt, "sampling_params": sampling,
                                                 "return_logprob": True}).json()
    chunks = events(reference_server, "/generate", {"input_ids": prompt, "sampling_params": sampling,
                                                    "return_logprob": True, "stream": True})
    assert len(chunks) == len(whole["output_ids"]) > 1  # one chunk per token, as generated
    for a, b in zip(chunks, chunks[1:]):  # SGLang default: cumulative chunks
        assert b["text"].startswith(a["text"]) and b["output_ids"][: len(a["output_ids"])] == a["output_ids"]
    last = chunks[-1]
    assert last["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    assert all(c["meta_info"]["finish_reason"] is None for c in chunks[:-1])
    for key in ("text", "output_ids"):
        assert last[key] == whole[key]
    for key in ("finish_reason", "output_token_logprobs", "completion_tokens", "weight_version"):
        assert last["meta_info"][key] == whole["meta_info"][key]

    body = {"prompt": prompt, "max_tokens": 30, "temperature": 0.8, "seed": 5, "stop": stop, "logprobs": 0,
            "return_token_ids": True, "ignore_eos": True}
    plain = post(reference_server, "/v1/completions", body).json()["choices"][0]
    parts = events(reference_server, "/v1/completions",
                   {**body, "stream": True, "stream_options": {"include_usage": True}})
    usage, parts = parts[-1], parts[:-1]
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == len(plain["token_ids"])
    got = [p["choices"][0] for p in parts]
    assert got[0]["prompt_token_ids"] == prompt and all("prompt_token_ids" not in g for g in got[1:])
    assert sum((g["token_ids"] for g in got), []) == plain["token_ids"]
    assert "".join(g["text"] for g in got) == plain["text"]
    assert sum((g["logprobs"]["token_logprobs"] for g in got), []) == plain["logprobs"]["token_logprobs"]
    assert (got[-1]["finish_reason"], got[-1]["stop_reason"]) == (plain["finish_reason"], plain["stop_reason"])


def test_scripted_replies_round_trip(start_reference_server, policies_dir: Path, chat_ids, hf_tokenizer,
                                     forward_logprobs) -> None:
    base = start_reference_server(policies_dir / "tool-call.yaml")
    tools = [{"type": "function", "function": {"name": "Bash", "parameters": {"type": "object"}}}]
    first = chat_ids(MESSAGES, tools)
    resp = generate(base, first, temperature=1.0, max_new_tokens=200)
    ids, lps = triples(resp)
    reply = ('<think>\nI will write the file with the shell tool.\n</think>\n\n<tool_call>\n'
             '{"name": "Bash", "arguments": {"command": "echo polar > polar.txt"}}\n</tool_call>')
    assert hf_tokenizer.decode(ids) == reply + "<|im_end|>" and ids[-1] == hf_tokenizer.eos_token_id
    assert resp["text"] == reply and resp["meta_info"]["policy_rule"] == "write-file"
    assert lps == pytest.approx(forward_logprobs(first, ids), abs=1e-5)  # the model's own logprobs
    streamed = events(base, "/generate", {"input_ids": first, "return_logprob": True, "stream": True})[-1]
    assert streamed["output_ids"] == ids
    call = {"role": "assistant", "content": "", "reasoning_content": "I will write the file with the shell tool.",
            "tool_calls": [{"function": {"name": "Bash", "arguments": {"command": "echo polar > polar.txt"}}}]}
    second = chat_ids(MESSAGES + [call, {"role": "tool", "content": ""}], tools)
    assert second[: len(first) + len(ids)] == first + ids  # the reply re-renders to the same tokens
    done = post(base, "/v1/completions", {"prompt": second, "max_tokens": 50, "return_token_ids": True}).json()
    assert done["choices"][0]["text"] == "<think>\nThe file is written.\n</think>\n\nDone."
    plain = generate(base, chat_ids(MESSAGES, [{"type": "function", "function": {"name": "python"}}]),
                     temperature=0, max_new_tokens=5)
    assert "policy_rule" not in plain["meta_info"]  # no rule matched: sampled as usual


@pytest.mark.parametrize("path, body, fragment", [
    ("/generate", "not json", "not valid JSON"),
    ("/generate", [1, 2], "JSON object"),
    ("/generate", {}, "exactly one of"),
    ("/generate", {"input_ids": [1], "text": "x"}, "exactly one of"),
    ("/generate", {"input_ids": [[1, 2]]}, "batches"),
    ("/generate", {"input_ids": [1, 99999]}, "vocabulary range"),
    ("/generate", {"input_ids": []}, "empty"),
    ("/generate", {"input_ids": [1], "sampling_params": {"max_new_tokens": "5"}}, "max_new_tokens"),
    ("/generate", {"input_ids": [1], "sampling_params": {"temprature": 0}}, "temprature"),
    ("/generate", {"input_ids": [1], "sampling_params": {"top_p": 0}}, "top_p"),
    ("/generate", {"input_ids": [1], "sampling_params": {"frequency_penalty": 0.5}}, "frequency_penalty"),
    ("/generate", {"input_ids": [1] * 4000, "sampling_params": {"max_new_tokens": 200}}, "context length"),
    ("/v1/completions", {"prompt": [1], "n": 2}, "`n`"),
    ("/v1/completions", {"prompt": [[1], [2]]}, "batches"),
    ("/v1/completions", {"prompt": [1], "max_tokens": 0}, "max_tokens"),
    ("/v1/completions", {"max_tokens": 3}, "prompt"),
    ("/v1/completions", {"prompt": [1], "logprobs": 99}, "logprobs"),
    ("/update_weights_from_disk", {"model_path": "/nonexistent"}, "model_path"),
])
def test_bad_requests_get_a_json_400(reference_server: str, path: str, body: Any, fragment: str) -> None:
    content = body if isinstance(body, str) else json.dumps(body)
    r = httpx.post(reference_server + path, content=content, timeout=30)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert fragment in error["message"] and error["type"]
    assert httpx.get(reference_server + "/health").status_code == 200


def test_concurrent_requests_match_sequential_ones(reference_server: str, prompt: list[int]) -> None:
    jobs = [{"temperature": 0.9, "seed": s, "max_new_tokens": 20 + s} for s in range(8)]
    alone = [generate(reference_server, prompt[s:], **j) for s, j in enumerate(jobs)]

    def run(s: int) -> list[int]:
        if s % 2:  # mix streamed and plain requests
            body = {"input_ids": prompt[s:], "sampling_params": jobs[s], "stream": True}
            return events(reference_server, "/generate", body)[-1]["output_ids"]
        return generate(reference_server, prompt[s:], **jobs[s])["output_ids"]

    with ThreadPoolExecutor(8) as pool:
        together = list(pool.map(run, range(8)))
    assert together == [a["output_ids"] for a in alone]


def test_info_endpoints(reference_server: str, tiny_model_dir: Path) -> None:
    info = httpx.get(reference_server + "/get_model_info").json()
    assert info["vocab_size"] == 1024 and info["max_context_length"] == 4096
    assert info["eos_token_ids"] == [2, 0] and info["weight_version"] == "0"
    assert Path(info["model_path"]).resolve() == tiny_model_dir.resolve()
    assert httpx.get(reference_server + "/v1/models").json()["data"][0]["id"] == "tiny-qwen2"


@pytest.fixture(scope="module")
def own_server(tiny_model_dir: Path) -> Iterator[str]:
    """A server of its own: these tests change its weights and pause it; with a longer context than the model's."""
    with launch(tiny_model_dir, None, ("--context-length", "20000")) as base:
        yield base


def test_context_length_takes_a_harness_sized_prompt(own_server: str, reference_server: str) -> None:
    """`polar serve --context-length 20000`: the ~18k-token prompts of Codex and Claude Code fit a model whose
    config says 4096 (the service path once masked every such sample: `prompt is 17784 tokens`)."""
    body = {"input_ids": [5] * 6000, "sampling_params": {"max_new_tokens": 1, "temperature": 0}}
    assert httpx.post(reference_server + "/generate", json=body, timeout=60).status_code == 400  # the model's 4096
    r = httpx.post(own_server + "/generate", json=body, timeout=120)
    assert r.status_code == 200 and r.json()["meta_info"]["prompt_tokens"] == 6000, r.text
    assert httpx.get(own_server + "/get_model_info").json()["max_context_length"] == 20000


def test_weight_reload_changes_version_and_outputs(own_server: str, tmp_path: Path, tiny_model_dir: Path,
                                                   prompt: list[int], make_tiny_model) -> None:
    before = generate(own_server, prompt, temperature=0, max_new_tokens=12)
    other = tmp_path / "seed1"
    tok = Tokenizer.from_file(str(tiny_model_dir / "tokenizer.json"))
    make_tiny_model.build_model(tok, seed=1).save_pretrained(other)
    r = post(own_server, "/update_weights_from_disk", {"model_path": str(other)}, timeout=60)
    assert r.status_code == 200 and r.json()["success"] and r.json()["weight_version"] == "1"
    after = generate(own_server, prompt, temperature=0, max_new_tokens=12)
    assert after["meta_info"]["weight_version"] == "1" and after["output_ids"] != before["output_ids"]
    assert httpx.get(own_server + "/get_model_info").json()["weight_version"] == "1"
    named = post(own_server, "/update_weights_from_disk", {"model_path": str(tiny_model_dir),
                                                          "weight_version": "7"}, timeout=60).json()
    assert named["weight_version"] == "7"
    assert generate(own_server, prompt, temperature=0, max_new_tokens=12)["output_ids"] == before["output_ids"]


def wait_for_held_request(base: str, timeout_s: float = 60.0) -> dict[str, Any]:
    """The server's model info once it reports one request held at its paused gate."""
    deadline = time.monotonic() + timeout_s
    while True:
        info = httpx.get(base + "/get_model_info").json()
        if info["held_requests"] == 1:
            return info
        assert time.monotonic() < deadline, f"no request was held by the paused server: {info}"
        time.sleep(0.05)


def test_pause_holds_new_requests_and_lets_in_flight_ones_finish(own_server: str, prompt: list[int]) -> None:
    long_body = {"input_ids": prompt, "stream": True,
                 "sampling_params": {"max_new_tokens": 300, "ignore_eos": True, "temperature": 0}}
    started = threading.Event()
    with ThreadPoolExecutor(2) as pool:
        in_flight = pool.submit(events, own_server, "/generate", long_body, started)
        assert started.wait(30)  # generating: now pause must let it run to its end
        assert post(own_server, "/pause_generation", {}).json()["paused"]
        assert len(in_flight.result(timeout=30)[-1]["output_ids"]) == 300  # it was not cut off
        held = pool.submit(generate, own_server, prompt, temperature=0, max_new_tokens=4)
        info = wait_for_held_request(own_server)  # the server holds it: it is waiting at the gate, not running
        assert info["paused"] and not held.done()
        post(own_server, "/resume_generation", {})
        assert len(held.result(timeout=30)["output_ids"]) == 4
        assert httpx.get(own_server + "/get_model_info").json()["held_requests"] == 0
