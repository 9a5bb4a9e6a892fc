import json

import pytest

from polar_mitm.conversation import Sampling
from polar_mitm.engines.api import EngineError, EngineOutput, SSEDecoder, apply_chunk, engine_request, parse_engine


def test_sglang_request_carries_ids_and_asks_for_logprobs():
    path, body = engine_request("sglang", [1, 2, 3], Sampling(temperature=0.0, stop=("x",), seed=7), 16, stream=True)
    assert path == "/generate"
    assert body["input_ids"] == [1, 2, 3] and body["return_logprob"] is True and body["stream"] is True
    assert body["sampling_params"] == {"max_new_tokens": 16, "skip_special_tokens": False, "temperature": 0.0,
                                       "stop": ["x"], "sampling_seed": 7}


def test_vllm_request_uses_token_prompt_and_token_ids():
    path, body = engine_request("vllm", [5], Sampling(top_k=4), 8, stream=False, model="m")
    assert path == "/v1/completions"
    assert body["prompt"] == [5] and body["return_token_ids"] is True and body["model"] == "m"
    assert body["top_k"] == 4 and body["max_tokens"] == 8


def sglang_chunk(ids, lps, total, finish=None, version="3"):
    return {"output_ids": ids, "meta_info": {"output_token_logprobs": [[lp, t, None] for lp, t in zip(lps, ids)],
                                             "completion_tokens": total, "finish_reason": finish,
                                             "weight_version": version}}


def test_sglang_cumulative_and_incremental_chunks_give_the_same_tokens():
    cumulative, incremental = EngineOutput(), EngineOutput()
    for n in (1, 2, 4):
        ids = [7] * n  # repeated ids: only the completion count tells the two styles apart
        apply_chunk("sglang", sglang_chunk(ids, [-0.5] * n, n), cumulative)
    for ids, total in (([7], 1), ([7], 2), ([7, 7], 4)):
        apply_chunk("sglang", sglang_chunk(ids, [-0.5] * len(ids), total), incremental)
    apply_chunk("sglang", sglang_chunk([], [], 4, {"type": "length"}), cumulative)
    assert cumulative.output_ids == incremental.output_ids == [7, 7, 7, 7]
    assert cumulative.logprobs == [-0.5] * 4
    assert cumulative.finish_reason == "length" and cumulative.weight_version == 3


def test_vllm_chunks_accumulate_and_missing_ids_are_an_error():
    out = EngineOutput()
    apply_chunk("vllm", {"choices": [{"token_ids": [1, 2], "logprobs": {"token_logprobs": [-1.0, -2.0]}}]}, out)
    apply_chunk("vllm", {"choices": [{"token_ids": [3], "logprobs": {"token_logprobs": [-3.0]},
                                      "finish_reason": "stop"}]}, out)
    assert out.output_ids == [1, 2, 3] and out.logprobs == [-1.0, -2.0, -3.0] and out.finish_reason == "stop"
    with pytest.raises(EngineError, match="return_token_ids"):
        apply_chunk("vllm", {"choices": [{"text": "hi"}]}, EngineOutput())


def test_sse_decoder_handles_any_split():
    events = [{"a": i} for i in range(3)]
    raw = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events) + b"data: [DONE]\n\n"
    for cut in range(1, len(raw)):
        dec = SSEDecoder()
        got = dec.feed(raw[:cut]) + dec.feed(raw[cut:])
        assert got == events and dec.done


def test_engine_name_is_validated():
    assert parse_engine("vllm") == "vllm"
    with pytest.raises(ValueError):
        parse_engine("tgi")
