"""The engine in-process: stop rules, held-back text, teacher forcing and SGLang's incremental chunks."""
from __future__ import annotations

from pathlib import Path

import pytest

from polar_serve import api_sglang
from polar_serve.engine import Engine
from polar_serve.sampling import SamplingParams
from polar_serve.sequence import Finish, Sequence

PROMPT = [1, 454, 205, 78, 79, 2, 205, 1, 534, 205]  # <|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n


@pytest.fixture(scope="module")
def engine(tiny_model_dir: Path) -> Engine:
    return Engine(tiny_model_dir)


def run(engine: Engine, params: SamplingParams, forced: list[int] | None = None,
        prompt: list[int] = PROMPT) -> tuple[Sequence, list[str]]:
    seq = Sequence(engine, prompt, params, forced)
    seq.start()
    texts = []
    while not seq.finished:
        seq.step()
        texts.append(seq.text())
    return seq, texts


def greedy(n: int, **kw) -> SamplingParams:
    return SamplingParams(max_new_tokens=n, temperature=0.0, **kw)


def test_stop_string_is_held_back_then_trimmed(engine: Engine) -> None:
    base, _ = run(engine, greedy(24, ignore_eos=True))
    full = base.text()
    stop = full[len(full) // 2: len(full) // 2 + 3]
    seq, texts = run(engine, greedy(24, ignore_eos=True, stop=(stop,)))
    cut = full.index(stop)
    assert seq.finish == Finish("stop", stop) and seq.text() == full[:cut]
    assert all(stop not in t for t in texts)
    assert all(b.startswith(a) for a, b in zip(texts, texts[1:]))  # streamed text only ever grows
    kept, _ = run(engine, greedy(24, ignore_eos=True, stop=(stop,), keep_stop=True))
    assert kept.text() == full[: cut + len(stop)] and kept.out.ids == seq.out.ids


def test_stop_token_is_in_the_ids_not_in_the_text(engine: Engine) -> None:
    base, _ = run(engine, greedy(12, ignore_eos=True))
    stop_id = base.out.ids[5]
    seq, _ = run(engine, greedy(12, ignore_eos=True, stop_token_ids=(stop_id,)))
    first = base.out.ids.index(stop_id)
    assert seq.out.ids == base.out.ids[: first + 1] and seq.finish == Finish("stop", stop_id)
    assert seq.text() == engine.decode(base.out.ids[:first])


def test_forced_reply_is_scored_and_cut_like_a_sampled_one(engine: Engine, forward_logprobs) -> None:
    reply = engine.encode("<think>\nok\n</think>\n\nDone.") + [engine.tokenizer.eos_token_id]
    seq, _ = run(engine, greedy(64), forced=reply)
    assert seq.out.ids == reply and seq.finish == Finish("stop", engine.tokenizer.eos_token_id)
    assert seq.out.logprobs == pytest.approx(forward_logprobs(PROMPT, reply), abs=1e-5)
    short, _ = run(engine, greedy(3), forced=reply)
    assert short.out.ids == reply[:3] and short.finish == Finish("length")
    none, _ = run(engine, greedy(0), forced=reply)
    assert none.out.ids == [] and none.finish == Finish("length")


def test_top_k_one_and_tiny_top_p_are_greedy(engine: Engine) -> None:
    want, _ = run(engine, greedy(10, ignore_eos=True))
    for params in (SamplingParams(max_new_tokens=10, top_k=1, ignore_eos=True, seed=3),
                   SamplingParams(max_new_tokens=10, top_p=1e-6, ignore_eos=True, seed=4)):
        got, _ = run(engine, params)
        assert got.out.ids == want.out.ids
        assert got.out.logprobs == pytest.approx(want.out.logprobs, abs=1e-6)  # raw logprobs, not processed


def test_sglang_incremental_chunks_add_up_to_the_cumulative_response(engine: Engine) -> None:
    req = api_sglang.parse_request({"input_ids": PROMPT, "return_logprob": True,
                                    "sampling_params": {"temperature": 0, "max_new_tokens": 9, "ignore_eos": True}})
    seq = Sequence(engine, PROMPT, req.params)
    seq.start()
    cursor, chunks = api_sglang.Cursor(), []
    while not seq.finished:
        seq.step()
        chunks.append(api_sglang.render(seq, req, "rid", 0.0, cursor))
    whole = api_sglang.render(seq, req, "rid", 0.0)
    assert "".join(c["text"] for c in chunks) == whole["text"]
    assert sum((c["output_ids"] for c in chunks), []) == whole["output_ids"]
    assert sum((c["meta_info"]["output_token_logprobs"] for c in chunks), []) == \
        whole["meta_info"]["output_token_logprobs"]
