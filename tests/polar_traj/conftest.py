"""Hand-built CallRecords: small factories exposed as fixtures (test modules never import conftest)."""
from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any, Callable, Sequence

import pytest

from polar_traj.outcomes import parse_outcomes
from polar_traj.pipeline import Selection, build_parquet
from polar_traj.records import CallRecord, append_record

EOT = 99  # the end-of-turn token in these hand-built sessions
_DEFAULT = object()
_clock = itertools.count(1)


def logprobs_for(tokens: Sequence[int]) -> tuple[float, ...]:
    """Distinct, float32-exact logprobs (multiples of 1/4) so round trips compare with ==."""
    return tuple(-(1 + t % 5) / 4 for t in tokens)


def make_record(prompt: Sequence[int], output: Sequence[int], *, call_id: str | None = None,
                task_id: str = "task", session_id: str = "sess", api: str = "openai_chat",
                logprobs: Any = _DEFAULT, started_at: float | None = None, finish_reason: str | None = "stop",
                prefix_source: str = "substituted", error: str | None = None, flags: Sequence[str] = (),
                policy_version: int | None = 1, request: dict | None = None, response: dict | None = None,
                model: str = "tiny", parent_call_id: str | None = None) -> CallRecord:
    tick = next(_clock)
    start = float(tick) if started_at is None else started_at
    return CallRecord(
        call_id=call_id or f"call-{tick}", task_id=task_id, session_id=session_id, api=api, model=model,
        stream=False, started_at=start, ended_at=start + 0.5, latency_ms=500.0, policy_version=policy_version,
        prompt_ids=tuple(prompt), output_ids=tuple(output),
        output_logprobs=logprobs_for(output) if logprobs is _DEFAULT else tuple(logprobs),
        finish_reason=finish_reason, prefix_source=prefix_source, parent_call_id=parent_call_id,
        request=request if request is not None else {"model": model, "messages": [{"role": "user", "content": "hi"}]},
        response=response, error=error, flags=tuple(flags),
    )


def write_records(capture_dir: Path, records: Sequence[CallRecord]) -> Path:
    for r in records:
        append_record(capture_dir, r)
    return capture_dir


def chain_session(turns: int, *, system: Sequence[int] = tuple(range(1, 9)), session_id: str = "sess",
                  task_id: str = "task", output_len: int = 3, between_len: int = 2) -> list[CallRecord]:
    """An append-only agent loop: each prompt = previous prompt + output + tool result tokens."""
    records, prompt = [], list(system)
    for n in range(turns):
        out = [200 + 10 * n + k for k in range(output_len - 1)] + [EOT]
        reply = {"choices": [{"message": {"role": "assistant", "content": f"turn {n}"}}]}
        records.append(make_record(prompt, out, call_id=f"{session_id}-c{n}", session_id=session_id,
                                   task_id=task_id, response=reply))
        prompt = prompt + out + [500 + 10 * n + k for k in range(between_len)]
    return records


@pytest.fixture(name="make_record")
def _make_record_fixture() -> Callable[..., CallRecord]:
    return make_record


@pytest.fixture(name="write_records")
def _write_records_fixture() -> Callable[[Path, Sequence[CallRecord]], Path]:
    return write_records


@pytest.fixture(name="chain_session")
def _chain_session_fixture() -> Callable[..., list[CallRecord]]:
    return chain_session


@pytest.fixture(name="logprobs_for")
def _logprobs_for_fixture() -> Callable[[Sequence[int]], tuple[float, ...]]:
    return logprobs_for


@pytest.fixture
def capture(tmp_path: Path) -> Path:
    path = tmp_path / "capture"
    path.mkdir()
    return path


@pytest.fixture
def dataset(tmp_path: Path) -> Path:
    """A small built file: task t, sessions s1 (3 turns, codex, reward 1), s2 (2 turns, claude, reward 0,
    one call without logprobs), s3 (1 turn, infrastructure error)."""
    capture = tmp_path / "dataset-capture"
    s2 = chain_session(2, session_id="s2", task_id="t")
    s2[0] = make_record(s2[0].prompt_ids, s2[0].output_ids, call_id=s2[0].call_id, session_id="s2", task_id="t",
                        logprobs=(), finish_reason="length", started_at=s2[0].started_at, response=s2[0].response)
    write_records(capture, chain_session(3, session_id="s1", task_id="t") + s2
                  + chain_session(1, session_id="s3", task_id="t"))
    outcomes = parse_outcomes([
        {"session_id": "s1", "reward": 1.0, "harness": "codex"},
        {"session_id": "s2", "reward": 0.0, "harness": "claude"},
        {"session_id": "s3", "status": "error", "reason": "sandbox died", "harness": "claude"},
    ])
    out = tmp_path / "dataset.parquet"
    build_parquet(Selection(capture), out, outcomes=outcomes)
    return out
