"""The reference server's prefix cache over real HTTP: a conversation's next prompt is served from the KV states
its previous call left, reported as `cached_tokens`, with the numbers a server without the cache gives; it is
flushed by /flush_cache and by new weights, and bounded by memory. Also --step-delay-ms."""
from __future__ import annotations

import random
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Iterator

import httpx
import pytest
import torch
from tokenizers import Tokenizer

from polar_serve.engine import PREFILL_CHUNK, Engine
from polar_serve.sampling import SamplingParams
from polar_serve.sequence import Sequence
from polar_serve.launch import reference_server as launch
from tests.polar_serve.test_serve_http import events, generate, post, triples

WORDS = "file shell write read polar token cache prefix model engine session replica python test build run".split()
NEXT_TURN = "<|im_end|>\n<|im_start|>user\nagain<|im_end|>\n<|im_start|>assistant\n"
GREEDY = {"temperature": 0, "max_new_tokens": 24, "ignore_eos": True}


def blocks(n: int) -> int:
    """The prefix cache keeps and reuses whole prefill chunks."""
    return n // PREFILL_CHUNK * PREFILL_CHUNK


@pytest.fixture(scope="module")
def conversation(chat_ids) -> Callable[[str], list[int]]:
    """conversation(tag) -> a first prompt of ~650 tokens whose opening is unique to the tag, so no other
    request can share a whole cached chunk with it."""
    def first(tag: str) -> list[int]:
        rng = random.Random(tag)
        text = " ".join(rng.choice(WORDS) for _ in range(300))
        return chat_ids([{"role": "system", "content": f"Session {tag}. {text}"},
                         {"role": "user", "content": "Fix it."}])

    return first


@pytest.fixture(scope="module")
def next_turn(hf_tokenizer) -> list[int]:
    return list(hf_tokenizer.encode(NEXT_TURN, add_special_tokens=False))


@pytest.fixture(scope="module")
def cached_server(tiny_model_dir: Path) -> Iterator[str]:
    """A server of its own (default prefix cache): these tests flush it and change its weights."""
    with launch(tiny_model_dir) as base:
        yield base


@pytest.fixture(scope="module")
def uncached_server(start_reference_server) -> str:
    return start_reference_server(None, None, "--prefix-cache-mb", "0")


def cached_tokens(resp: dict) -> int:
    return resp["meta_info"]["cached_tokens"]


def test_a_growing_conversation_is_served_from_the_cache(cached_server: str, uncached_server: str, conversation,
                                                         hf_tokenizer, forward_logprobs) -> None:
    first = conversation("grow")
    one = generate(cached_server, first, **GREEDY)
    assert cached_tokens(one) == 0  # nothing else shares a whole chunk with this prompt
    words = " ".join(random.Random(1).choice(WORDS) for _ in range(80))
    second = first + one["output_ids"] + hf_tokenizer.encode(NEXT_TURN.replace("again", words),
                                                             add_special_tokens=False)
    two = generate(cached_server, second, **GREEDY)
    assert cached_tokens(two) == blocks(len(first)) > 0  # the prompt part of the first call's KV states
    ids, lps = triples(two)
    cold = generate(uncached_server, second, **GREEDY)
    assert cached_tokens(cold) == 0 and cold["output_ids"] == ids
    assert lps == pytest.approx(triples(cold)[1], abs=1e-5)
    assert lps == pytest.approx(forward_logprobs(second, ids), abs=1e-5)
    again = generate(cached_server, second, **GREEDY)  # a replay: all but the last chunk from the cache,
    assert cached_tokens(again) == blocks(len(second) - 1) > cached_tokens(two)
    assert triples(again) == (ids, lps)  # and bit-for-bit the numbers of the call it replays
    vllm = post(cached_server, "/v1/completions", {"prompt": second, "max_tokens": 24, "temperature": 0,
                                                   "ignore_eos": True, "logprobs": 0}).json()
    assert vllm["usage"]["prompt_tokens_details"] == {"cached_tokens": blocks(len(second) - 1)}
    assert vllm["choices"][0]["logprobs"]["token_logprobs"] == lps


def test_scripted_replies_are_served_from_the_cache(start_reference_server, policies_dir: Path, conversation,
                                                    next_turn: list[int], forward_logprobs) -> None:
    base = start_reference_server(policies_dir / "echo.yaml")
    first = conversation("scripted")
    one = generate(base, first, max_new_tokens=64)
    assert one["meta_info"]["policy_rule"] == "echo" and cached_tokens(one) == 0
    second = first + one["output_ids"] + next_turn
    two = generate(base, second, max_new_tokens=64)
    assert two["text"] == "You said: again"
    # the teacher-forced pass kept the KV states of the prompt and the whole scripted reply
    assert cached_tokens(two) == blocks(len(first) + len(one["output_ids"])) > 0
    ids, lps = triples(two)
    assert lps == pytest.approx(forward_logprobs(second, ids), abs=1e-5)


def test_flush_and_new_weights_empty_the_cache(cached_server: str, conversation, next_turn: list[int],
                                               forward_logprobs, tmp_path: Path, tiny_model_dir: Path,
                                               make_tiny_model) -> None:
    first = conversation("flush")
    second = first + generate(cached_server, first, **GREEDY)["output_ids"] + next_turn
    assert cached_tokens(generate(cached_server, second, **GREEDY)) > 0
    flushed = post(cached_server, "/flush_cache", {}).json()
    assert flushed["success"] and flushed["flushed_entries"] >= 1 and flushed["flushed_tokens"] >= blocks(len(first))
    assert cached_tokens(generate(cached_server, second, **GREEDY)) == 0
    assert cached_tokens(generate(cached_server, second, **GREEDY)) > 0  # cached again

    other = tmp_path / "seed1"
    make_tiny_model.build_model(Tokenizer.from_file(str(tiny_model_dir / "tokenizer.json")),
                                seed=1).save_pretrained(other)
    r = post(cached_server, "/update_weights_from_disk", {"model_path": str(other)}, timeout=60)
    assert r.status_code == 200 and r.json()["success"]
    new = generate(cached_server, second, **GREEDY)
    assert cached_tokens(new) == 0 and new["meta_info"]["weight_version"] == r.json()["weight_version"]
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(other, dtype=torch.float32).eval()
    ids, lps = triples(new)
    assert lps == pytest.approx(forward_logprobs(second, ids, model), abs=1e-5)  # the new weights' numbers
    assert post(cached_server, "/flush_cache", {}).json()["flushed_entries"] == 1  # its own entry only


def test_the_memory_bound_evicts_the_least_recently_used(start_reference_server, uncached_server: str,
                                                         conversation, next_turn: list[int]) -> None:
    # an entry of a ~700-token first call keeps 512 positions x 512 bytes (tiny model: 2 layers, keys and values
    # of 2 KV heads x 16 float32): two fit in 0.6 MB, three do not
    base = start_reference_server(None, None, "--prefix-cache-mb", "0.6")
    seconds = {}
    for tag in ("lru-a", "lru-b", "lru-c"):  # the third entry pushes out the first
        first = conversation(tag)
        seconds[tag] = first + generate(base, first, **GREEDY)["output_ids"] + next_turn
    for tag, hit in (("lru-a", False), ("lru-c", True)):
        resp = generate(base, seconds[tag], **GREEDY)
        assert (cached_tokens(resp) > 0) is hit, tag
        cold = generate(uncached_server, seconds[tag], **GREEDY)
        assert resp["output_ids"] == cold["output_ids"]
        assert triples(resp)[1] == pytest.approx(triples(cold)[1], abs=1e-5)


def test_step_delay_slows_a_request_without_holding_up_others(start_reference_server, conversation) -> None:
    base = start_reference_server(None, None, "--step-delay-ms", "50")
    prompt = conversation("delay")[:40]
    slow = {"input_ids": prompt, "stream": True, "sampling_params": {**GREEDY, "max_new_tokens": 100}}
    started = threading.Event()
    with ThreadPoolExecutor(1) as pool:
        long_stream = pool.submit(events, base, "/generate", slow, started)
        assert started.wait(60)
        short: list[dict[str, Any]] = events(base, "/generate", {**slow, "sampling_params": {
            **GREEDY, "max_new_tokens": 3}})  # runs to its end while the long one is still streaming
        assert len(short[-1]["output_ids"]) == 3 and not long_stream.done()
        assert len(long_stream.result(timeout=120)[-1]["output_ids"]) == 100
    assert httpx.get(base + "/health").json()["status"] == "ok"


def test_a_reused_entry_is_never_changed_and_a_longer_one_replaces_it(tiny_model_dir: Path, conversation,
                                                                      next_turn: list[int]) -> None:
    engine = Engine(tiny_model_dir)

    def run(prompt: list[int]) -> Sequence:
        seq = Sequence(engine, prompt, SamplingParams(max_new_tokens=120, temperature=1.0, seed=5, ignore_eos=True))
        seq.start()
        while not seq.finished:
            seq.step()
        return seq

    first = conversation("in-process")
    one = run(first)
    (entry,) = engine.prefix_cache.entries()
    before = [(layer.keys.clone(), layer.values.clone()) for layer in entry.cache.layers]
    second = first + one.out.ids + next_turn
    two = run(second)  # 120 sampled tokens: second reaches into a chunk beyond the entry
    assert two.cached_tokens == blocks(len(first)) > 0
    assert all(torch.equal(k, layer.keys) and torch.equal(v, layer.values)
               for (k, v), layer in zip(before, entry.cache.layers))
    (longer,) = engine.prefix_cache.entries()  # the old entry is a prefix of the new one: dropped
    assert longer.ids.tolist() == second[: blocks(len(second))] and len(longer.ids) > len(entry.ids)
    assert engine.flush_prefix_cache("test").entries == 1 and len(engine.prefix_cache) == 0


@pytest.mark.parametrize("flag, value", [("--prefix-cache-mb", "-1"), ("--step-delay-ms", "inf"),
                                         ("--step-delay-ms", "soon")])
def test_bad_flag_values_are_refused_by_name(tiny_model_dir: Path, flag: str, value: str) -> None:
    done = subprocess.run([sys.executable, "-m", "polar_serve", "serve", "--model", str(tiny_model_dir), flag, value],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and flag in done.stderr and value in done.stderr
