"""Property tests (hypothesis): prefix_merge is exact on arbitrary sessions.

Sessions are random mixes of append-only turns, forks, re-rendered histories (a cut anywhere in an
earlier call's tokens), unrelated calls, error records, truncated turns and missing logprobs, over a
small token alphabet so that accidental shared prefixes are common.
"""
from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from polar_traj.build import BuildConfig, build_session
from polar_traj.chains import REASONS, START_KINDS, _StartClassifier, find_parents, order_calls
from polar_traj.parquet import TrajectoryWriter, read
from polar_traj.reading import CapturedSession, SessionFile
from polar_traj.records import CallRecord

tokens = st.lists(st.integers(0, 5), max_size=4)


@st.composite
def sessions(draw) -> list[CallRecord]:
    records: list[CallRecord] = []
    for n in range(draw(st.integers(1, 12))):
        kind = draw(st.sampled_from(["extend", "extend", "extend", "rerender", "root", "error"]))
        usable = [r for r in records if r.error is None]
        if kind in ("extend", "rerender") and usable:
            base = draw(st.sampled_from(usable))
            full = list(base.prompt_ids + base.output_ids)
            cut = len(full) if kind == "extend" else draw(st.integers(0, len(full)))
            prompt = full[:cut] + draw(tokens)
        else:
            prompt = draw(tokens)
        prompt = prompt or [draw(st.integers(0, 5))]
        output = draw(st.lists(st.integers(0, 9), max_size=4))
        logprobs = () if draw(st.integers(0, 5)) == 0 else tuple(-0.25 * (t + 1) for t in output)
        records.append(CallRecord(
            call_id=f"c{n}", task_id="t", session_id="s", api="openai_chat", model="m", stream=False,
            started_at=float(draw(st.integers(0, 3)) + n), ended_at=float(n + 5), latency_ms=1.0,
            policy_version=draw(st.integers(0, 3)), prompt_ids=tuple(prompt), output_ids=tuple(output),
            output_logprobs=logprobs, finish_reason=draw(st.sampled_from(["stop", "length"])),
            prefix_source="substituted", parent_call_id=None, request={}, response=None,
            error="engine failed" if kind == "error" else None))
    return records


def build(records: list[CallRecord], strategy: str):
    session = CapturedSession(SessionFile("t", "s", None), records)
    return build_session(session, BuildConfig(strategy=strategy, keep_conversation=False))


def check_exact(t, calls: dict[str, CallRecord]) -> None:
    chain = [calls[c] for c in t.call_ids]
    sampled = [tok for tok, m in zip(t.response_ids, t.loss_mask) if m == 1]
    assert sampled == [tok for c in chain for tok in c.output_ids]
    engine_between = [tok for prev, c in zip(chain, chain[1:])
                      for tok in c.prompt_ids[len(prev.prompt_ids) + len(prev.output_ids):]]
    assert [tok for tok, m in zip(t.response_ids, t.loss_mask) if m == 0] == engine_between
    recorded = [lp for c in chain for lp in (c.output_logprobs or [0.0] * len(c.output_ids))]
    assert [lp for lp, m in zip(t.logprobs, t.loss_mask) if m == 1] == recorded
    assert all(lp == 0.0 for lp, m in zip(t.logprobs, t.loss_mask) if m == 0)
    # every sampled turn is trained in exactly the context the engine saw
    sequence, at = t.prompt_ids + t.response_ids, len(t.prompt_ids)
    for n, c in enumerate(chain):
        at += len(c.prompt_ids) - (len(chain[n - 1].prompt_ids) + len(chain[n - 1].output_ids)) if n else 0
        assert sequence[:at] == list(c.prompt_ids)
        at += len(c.output_ids)
    assert sequence == list(chain[-1].prompt_ids + chain[-1].output_ids)


@settings(max_examples=200, deadline=None)
@given(sessions())
def test_prefix_merge_is_exact(records):
    calls = {r.call_id: r for r in records}
    trajectories, stats = build(records, "prefix_merge")
    for t in trajectories:
        check_exact(t, calls)
        start = t.metadata["chain_start"]
        assert start["kind"] in START_KINDS and (start["reason"] in REASONS) == (start["kind"] == "break")
    assert stats.tokens_saved >= 0 and stats.calls_merged == stats.calls - stats.trajectories


@settings(max_examples=200, deadline=None)
@given(sessions())
def test_both_strategies_cover_the_same_calls(records):
    merged, _ = build(records, "prefix_merge")
    single, _ = build(records, "per_request")
    merged_ids = [c for t in merged for c in t.call_ids]
    usable = sorted(r.call_id for r in records if r.error is None)
    assert sorted(merged_ids) == sorted(c for t in single for c in t.call_ids) == usable
    assert len(merged_ids) == len(set(merged_ids))
    assert sum(sum(t.loss_mask) for t in merged) == sum(sum(t.loss_mask) for t in single)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sessions())
def test_parquet_keeps_every_token(tmp_path, records):
    trajectories, _ = build(records, "prefix_merge")
    path = tmp_path / "p.parquet"
    with TrajectoryWriter(path, rows_per_batch=3) as w:
        w.write_all(t.row() for t in trajectories)
    rows = read(path).to_pylist()
    assert [(r["prompt_ids"], r["response_ids"], r["loss_mask"], r["logprobs"]) for r in rows] == \
        [(t.prompt_ids, t.response_ids, t.loss_mask, t.logprobs) for t in trajectories]


def _lcp(a, b) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


@settings(max_examples=200, deadline=None)
@given(sessions())
def test_parents_and_shared_history_match_brute_force(records):
    calls = [r for r in order_calls(records) if r.error is None]
    parents = find_parents(calls)
    classifier = _StartClassifier(calls, parents)
    for i, call in enumerate(calls):
        fulls = [c.prompt_ids + c.output_ids for c in calls[:i]]
        extended = [j for j, f in enumerate(fulls) if f and call.prompt_ids[:len(f)] == f]
        assert parents[i] == max(extended, key=lambda j: (len(fulls[j]), j), default=None)
        if parents[i] is None:
            shared = [_lcp(call.prompt_ids, f) for f in fulls]
            k, best = classifier.shared_history(i)
            assert k == max(shared, default=0)
            assert not k or best == [j for j, s in enumerate(shared) if s == k]
