"""build.py: exact tokens, masks and logprobs under both strategies; truncation, missing logprobs, errors."""
from __future__ import annotations

import json

import pytest

from polar_traj.build import BuildConfig, build_session, chain_tokens, metadata_json, trajectory_id
from polar_traj.outcomes import parse_outcomes
from polar_traj.pipeline import Selection, iter_trajectories
from polar_traj.reading import read_session, scan
from polar_traj.stats import MergeStats

EOT = 99
P0 = list(range(1, 12))


def built(capture, write_records, records, **config):
    write_records(capture, records)
    (sf,) = scan(capture)
    return build_session(read_session(sf), BuildConfig(**config))


def test_prefix_merge_exact_tokens_masks_logprobs(capture, write_records, chain_session, logprobs_for):
    calls = chain_session(3, system=list(range(1, 9)))
    (t,), stats = built(capture, write_records, calls)
    assert t.prompt_ids == list(range(1, 9))
    assert t.response_ids == [200, 201, EOT, 500, 501, 210, 211, EOT, 510, 511, 220, 221, EOT]
    assert t.loss_mask == [1, 1, 1, 0, 0, 1, 1, 1, 0, 0, 1, 1, 1]
    lp = [logprobs_for([x])[0] for x in t.response_ids]
    assert t.logprobs == [v if m else 0.0 for v, m in zip(lp, t.loss_mask)]
    assert t.prompt_ids + t.response_ids == list(calls[-1].prompt_ids + calls[-1].output_ids)
    assert t.call_ids == [c.call_id for c in calls]
    assert t.trajectory_id == trajectory_id("sess", "prefix_merge", calls[0].call_id)
    assert t.metadata["chain_start"] == {"kind": "new", "reason": None, "related_call_id": None, "diverged_at": None}
    assert (t.metadata["per_request_tokens"], t.metadata["tokens"], t.metadata["tokens_saved"]) == (48, 21, 27)
    assert (stats.calls, stats.trajectories, stats.calls_merged) == (3, 1, 2)
    assert (stats.per_request_tokens, stats.trajectory_tokens, stats.trained_tokens) == (48, 21, 9)


def test_per_request_one_trajectory_per_call(capture, write_records, chain_session):
    calls = chain_session(3)
    trajectories, stats = built(capture, write_records, calls, strategy="per_request")
    assert [t.call_ids for t in trajectories] == [[c.call_id] for c in calls]
    for t, c in zip(trajectories, calls):
        assert (t.prompt_ids, t.response_ids) == (list(c.prompt_ids), list(c.output_ids))
        assert t.loss_mask == [1] * len(c.output_ids) and t.logprobs == list(c.output_logprobs)
        assert t.metadata["chain_start"] is None
    assert stats.tokens_saved == 0 and stats.token_ratio == 1.0


def test_rerendered_history_keeps_the_engine_context(capture, write_records, make_record):
    thinking = list(range(300, 310))
    c0 = make_record(P0, thinking + [40, EOT], call_id="c0")
    c1 = make_record(P0 + [40, EOT, 50], [41, EOT], call_id="c1", prefix_source="rendered:no_matching_call")
    (a, b), stats = built(capture, write_records, [c0, c1])
    assert (a.prompt_ids, a.response_ids) == (P0, thinking + [40, EOT])
    assert (b.prompt_ids, b.response_ids, b.loss_mask) == (P0 + [40, EOT, 50], [41, EOT], [1, 1])
    assert b.metadata["chain_start"]["reason"] == "template"
    assert b.metadata["rendered_calls"] == {"c1": "rendered:no_matching_call"}
    assert stats.breaks["template"] == 1 and stats.starts == {"new": 1, "fork": 0, "break": 1}


def test_truncated_output_closed_by_the_proxy_merges(capture, write_records, make_record):
    c0 = make_record(P0, [40, 41], call_id="c0", finish_reason="length")
    c1 = make_record(P0 + [40, 41, EOT, 50], [42, EOT], call_id="c1")
    (t,), stats = built(capture, write_records, [c0, c1])
    assert t.response_ids == [40, 41, EOT, 50, 42, EOT]
    assert t.loss_mask == [1, 1, 0, 0, 1, 1]  # the end-of-turn token was not sampled: mask 0
    assert t.metadata["truncated_call_ids"] == ["c0"] and not t.metadata["ends_truncated"]
    assert stats.truncated_calls == 1


def test_truncated_output_retokenized_starts_a_new_chain(capture, write_records, make_record):
    c0 = make_record(P0, [40, 41, 42], call_id="c0", finish_reason="length")
    c1 = make_record(P0 + [40, 41, 88, EOT, 50], [43, EOT], call_id="c1")
    (a, b), stats = built(capture, write_records, [c0, c1])
    assert a.response_ids == [40, 41, 42] and a.metadata["ends_truncated"]
    assert b.prompt_ids == P0 + [40, 41, 88, EOT, 50]
    assert stats.breaks["retokenized"] == 1


def test_missing_logprobs_filled_and_flagged(capture, write_records, make_record):
    c0 = make_record(P0, [40, EOT], call_id="c0", logprobs=())
    c1 = make_record(P0 + [40, EOT, 50], [41, EOT], call_id="c1")
    (t,), stats = built(capture, write_records, [c0, c1])
    assert t.logprobs == [0.0, 0.0, 0.0, -0.5, -1.25]
    assert t.metadata["logprobs_complete"] is False and t.metadata["logprobs_missing_call_ids"] == ["c0"]
    assert stats.missing_logprob_calls == 1


def test_missing_logprobs_refused(capture, write_records, make_record):
    with pytest.raises(ValueError, match="c0 has no logprobs"):
        built(capture, write_records, [make_record(P0, [40], call_id="c0", logprobs=())], missing_logprobs="refuse")


def test_error_records_are_never_turns(capture, write_records, make_record):
    c0 = make_record(P0, [40, EOT], call_id="c0")
    failed = make_record(P0 + [40, EOT, 50], [], call_id="failed", logprobs=(), error="engine answered 500")
    partial = make_record(P0 + [40, EOT, 50], [41], call_id="partial", error="stream cut")
    c1 = make_record(P0 + [40, EOT, 50], [42, EOT], call_id="c1")  # the harness retried
    records = [c0, failed, partial, c1]
    (t,), stats = built(capture, write_records, records)
    assert t.call_ids == ["c0", "c1"] and t.response_ids == [40, EOT, 50, 42, EOT]
    assert [e["call_id"] for e in t.metadata["session_error_calls"]] == ["failed", "partial"]
    assert (stats.calls, stats.error_calls) == (2, 2)


def test_unparsed_tool_calls_and_policy_versions(capture, write_records, make_record):
    c0 = make_record(P0, [40, EOT], call_id="c0", policy_version=3)
    c1 = make_record(P0 + [40, EOT, 50], [41, EOT], call_id="c1", policy_version=5, flags=["unparsed_tool_call"])
    (t,), _ = built(capture, write_records, [c0, c1])
    assert t.policy_versions == (3, 5)
    # each call's sampled tokens in the response and the version that sampled them: a trainer's per-call rule
    assert t.metadata["call_outputs"] == [[0, 2, 3], [3, 5, 5]]
    assert [t.response_ids[a:b] for a, b, _ in t.metadata["call_outputs"]] == [[40, EOT], [41, EOT]]
    assert t.metadata["unparsed_tool_call_ids"] == ["c1"]
    assert t.metadata["flags"] == {"c1": ["unparsed_tool_call"]}
    assert t.metadata["parent_mismatch_call_ids"] == []


def test_proxy_parent_that_disagrees_is_reported(capture, write_records, make_record):
    c0 = make_record(P0, [40, EOT], call_id="c0")
    c1 = make_record(P0 + [40, EOT, 50], [41, EOT], call_id="c1", parent_call_id="c0")
    c2 = make_record(P0 + [40, EOT, 50, 41, EOT, 51], [42, EOT], call_id="c2", parent_call_id="c0")
    (t,), _ = built(capture, write_records, [c0, c1, c2])
    assert t.metadata["parent_mismatch_call_ids"] == ["c2"]


def test_conversation_read_back_for_the_last_call(capture, write_records, make_record):
    c0 = make_record(P0, [40, EOT], call_id="c0", request={"messages": [{"role": "user", "content": "a"}]})
    c1 = make_record(P0 + [40, EOT, 50], [41, EOT], call_id="c1",
                     request={"messages": [{"role": "user", "content": "b"}]},
                     response={"choices": [{"message": {"content": "done"}}]})
    (t,), _ = built(capture, write_records, [c0, c1])
    assert t.metadata["conversation"] == {"api": "openai_chat", "call_id": "c1", "request": c1.request,
                                          "response": c1.response}
    capture2 = capture.parent / "capture2"
    (t,), _ = built(capture2, write_records, [c0, c1], keep_conversation=False)
    assert "conversation" not in t.metadata


def test_chain_tokens_refuses_calls_that_do_not_extend(make_record):
    with pytest.raises(ValueError, match="does not extend"):
        chain_tokens([make_record(P0, [40, EOT], call_id="a"), make_record(P0[:3], [1], call_id="b")])


def test_build_config_is_validated():
    with pytest.raises(ValueError, match="strategy"):
        BuildConfig(strategy="merge_everything")
    with pytest.raises(ValueError, match="missing_logprobs"):
        BuildConfig(missing_logprobs="guess")


def test_parallel_sessions_merge_independently(capture, write_records, make_record):
    """Two sessions of one task, same tokens, calls interleaved in time: never merged across sessions."""
    records = []
    for n in range(3):
        for sid in ("s1", "s2"):
            prompt = P0 + [tok for k in range(n) for tok in (40 + k, EOT, 60 + k)]
            records.append(make_record(prompt, [40 + n, EOT], call_id=f"{sid}-{n}", session_id=sid))
    write_records(capture, records)
    outcomes = parse_outcomes([{"session_id": "s1", "reward": 1.0},
                               {"session_id": "s2", "status": "timeout", "reason": "budget"}])
    stats = MergeStats()
    rows = [t.row() for t in iter_trajectories(Selection(capture), outcomes=outcomes, stats=stats)]
    assert [r["call_ids"] for r in rows] == [["s1-0", "s1-1", "s1-2"], ["s2-0", "s2-1", "s2-2"]]
    assert rows[0]["response_ids"] == rows[1]["response_ids"]
    assert [(r["status"], r["reward"], r["advantage"]) for r in rows] == [("completed", 1.0, 0.5),
                                                                         ("timeout", 0.0, -0.5)]
    assert rows[1]["loss_mask"] == rows[0]["loss_mask"]  # a timeout stays trainable
    assert (stats.sessions, stats.calls, stats.trajectories) == (2, 6, 2)


def test_metadata_names_the_engines_of_a_session_that_moved(capture, write_records, make_record):
    from dataclasses import replace

    a, b = "http://127.0.0.1:30000", "http://127.0.0.1:30001"
    c0 = replace(make_record(P0, [40, EOT], call_id="c0"), engine=a)
    # the replica went down: the next call ran on b, its prompt rendered in full (same tokens here)
    c1 = replace(make_record(P0 + [40, EOT, 50], [41, EOT], call_id="c1", prefix_source="rendered:engine_moved"),
                 engine=b)
    (t,), _ = built(capture, write_records, [c0, c1])
    assert t.call_ids == ["c0", "c1"] and t.metadata["engines"] == [a, b]
    assert t.metadata["rendered_calls"] == {"c1": "rendered:engine_moved"}
    (u,), _ = built(capture / "one-engine", write_records, [c0])
    assert u.metadata["engines"] == [a]


def test_each_chain_names_the_agent_its_framework_tagged(capture, write_records, make_record):
    """Two agents in one session (a handoff): each chain's metadata.agent is its first request's
    `metadata.agent`; a request without the tag names no agent."""
    def asked(agent):
        tags = {"metadata": {"agent": agent}} if agent else {}
        return {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], **tags}

    triage = make_record(P0, [40, EOT], call_id="t0", request=asked("triage"))
    coder = make_record([7, 7, 7], [41, EOT], call_id="c0", request=asked("coder"))
    coder_next = make_record([7, 7, 7, 41, EOT, 50], [42, EOT], call_id="c1", request=asked("coder"))
    plain = make_record([9, 9], [43, EOT], call_id="p0", request=asked(None))
    trajectories, _ = built(capture, write_records, [triage, coder, coder_next, plain])
    assert {tuple(t.call_ids): t.metadata.get("agent") for t in trajectories} == {
        ("t0",): "triage", ("c0", "c1"): "coder", ("p0",): None}


@pytest.mark.parametrize("metadata", [
    {"a": 1.5, "b": [0.0001, -2.5e15, 1e-5], "c": None, "d": True},  # an exponent: written by json
    {"started_at": 1733000000.25, "text": 'é "q" \\ \n\t\x00\x1f\x7f\u2028 😀', "n": [1, -2, 2**63 - 1]},
    {"x": float("nan")}, {"x": float("inf")}, {"x": 1e16}, {"x": 2**64}, {1: "int key"}, {"s": "\ud800"},
    {"nested": {"deep": [{"v": 9.5e-05}]}}, {"t": (1, 2.0)},
])
def test_metadata_json_is_what_json_dumps_writes(metadata):
    assert metadata_json(metadata) == json.dumps(metadata, separators=(",", ":"), ensure_ascii=False)
