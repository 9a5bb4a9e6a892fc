"""chains.py: parents by longest literal extension, forks, and why chains start where they do."""
from __future__ import annotations

import pytest

from polar_traj.chains import ChainStart, find_parents, main_children, order_calls, prefix_merge, rerender_reason

EOT = 99
SYS = list(range(1, 9))  # 8 system/tool tokens
P0 = SYS + [20, 21, 22]


def ids(chains):
    return [[c.call_id for c in chain.calls] for chain in chains]


def test_append_only_session_is_one_chain(chain_session):
    calls = chain_session(4)
    assert find_parents(calls) == [None, 0, 1, 2]
    chains = prefix_merge(calls)
    assert ids(chains) == [[c.call_id for c in calls]]
    assert chains[0].start == ChainStart("new")


def test_longest_match_wins(make_record):
    c0 = make_record(P0, [40, EOT], call_id="c0")
    c1 = make_record(P0 + [40, EOT, 50], [41, EOT], call_id="c1")
    c2 = make_record(P0 + [40, EOT, 50, 41, EOT, 51], [42, EOT], call_id="c2")  # extends c0 and c1
    assert find_parents([c0, c1, c2]) == [None, 0, 1]


def test_rerendered_history_template_starts_a_labelled_chain(make_record):
    thinking = [300] + list(range(301, 309)) + [309]  # <think> … </think>, stripped on re-render
    c0 = make_record(P0, thinking + [40, 41, EOT], call_id="c0")
    c1 = make_record(P0 + [40, 41, EOT, 50, 51], [42, EOT], call_id="c1", prefix_source="rendered:no_matching_call")
    c2 = make_record(P0 + [40, 41, EOT, 50, 51, 42, EOT, 52], [43, EOT], call_id="c2")
    chains = prefix_merge([c0, c1, c2])
    assert ids(chains) == [["c0"], ["c1", "c2"]]
    assert chains[1].start == ChainStart("break", "template", "c0", len(P0))


def test_retokenized_turn_is_labelled(make_record):
    c0 = make_record(P0, [40, 41, 42, 43, EOT], call_id="c0")
    c1 = make_record(P0 + [40, 41, 77, 78, 79, 43, EOT, 50], [44, EOT], call_id="c1")
    chains = prefix_merge([c0, c1])
    assert ids(chains) == [["c0"], ["c1"]]
    assert chains[1].start == ChainStart("break", "retokenized", "c0", len(P0) + 2)


def test_proxy_reason_names_the_break(make_record):
    c0 = make_record(P0, [40, 41, 42, 43, EOT], call_id="c0")
    c1 = make_record(P0 + [40, 41, 77, 78, 79, 43, EOT, 50], [44, EOT], call_id="c1",
                     prefix_source="rendered:template_not_append_only")
    assert prefix_merge([c0, c1])[1].start.reason == "template"


def test_truncated_output_extended_literally_merges(make_record):
    c0 = make_record(P0, [40, 41, 42], call_id="c0", finish_reason="length")  # no end-of-turn token
    c1 = make_record(P0 + [40, 41, 42, EOT, 50], [43, EOT], call_id="c1")  # proxy closed the turn
    assert ids(prefix_merge([c0, c1])) == [["c0", "c1"]]


def test_truncated_output_retokenized_by_the_harness(make_record):
    c0 = make_record(P0, [40, 41, 42], call_id="c0", finish_reason="length")
    c1 = make_record(P0 + [40, 41, 88, EOT, 50], [43, EOT], call_id="c1", prefix_source="rendered:no_matching_call")
    chains = prefix_merge([c0, c1])
    assert ids(chains) == [["c0"], ["c1"]]
    assert chains[1].start == ChainStart("break", "retokenized", "c0", len(P0) + 2)


def test_compaction_break(chain_session, make_record):
    calls = chain_session(3, system=P0)  # system + the user's task
    summary = make_record(SYS + [600, 601, 602], [610, EOT], call_id="after")
    more = make_record(SYS + [600, 601, 602, 610, EOT, 620], [611, EOT], call_id="more")
    chains = prefix_merge(calls + [summary, more])
    assert ids(chains)[1] == ["after", "more"]
    assert chains[1].start == ChainStart("break", "compaction", calls[-1].call_id, len(SYS))


def test_content_edit_break(chain_session, make_record):
    calls = chain_session(3, system=P0)  # P0 = system + the user's task
    edited = list(calls[2].prompt_ids) + list(calls[2].output_ids) + [520, 521]
    edited[len(SYS) + 1] = 555  # the harness rewrote the first user message (e.g. a fresh date)
    c3 = make_record(edited, [240, EOT], call_id="edited")
    chains = prefix_merge(calls + [c3])
    assert ids(chains) == [[c.call_id for c in calls], ["edited"]]
    assert chains[1].start == ChainStart("break", "content", calls[2].call_id, len(SYS) + 1)


def test_edit_after_a_parent_output_is_a_labelled_fork(chain_session, make_record):
    calls = chain_session(2, system=P0)  # prompt1 = P0 + out0 + [500, 501]
    edited = list(calls[1].prompt_ids)
    edited[len(P0) + 4] = 555  # the tool result after out0 changed; the prompt still extends call 0
    c2 = make_record(edited + list(calls[1].output_ids) + [510], [230, EOT], call_id="edited")
    c3 = make_record(edited + list(calls[1].output_ids) + [510, 230, EOT, 520], [240, EOT], call_id="next")
    chains = prefix_merge(calls + [c2, c3])
    assert ids(chains) == [[calls[0].call_id, "edited", "next"], [calls[1].call_id]]
    assert chains[1].start == ChainStart("break", "content", "edited", len(P0) + 4)


def test_rerender_of_the_latest_turn_only_keeps_merging(make_record):
    # the template drops reasoning from older turns only: call 2 extends call 0 but re-renders call 1
    c0 = make_record(P0, [40, EOT], call_id="c0")
    c1 = make_record(P0 + [40, EOT, 50], [300, 301, 302, 303, 304, 305, 306, 307, 308, 41, EOT], call_id="c1")
    c2 = make_record(P0 + [40, EOT, 50, 41, EOT, 51], [42, EOT], call_id="c2")
    chains = prefix_merge([c0, c1, c2])
    assert ids(chains) == [["c0", "c1"], ["c2"]]  # tie on subtree size: the earliest child continues
    assert chains[1].start == ChainStart("break", "template", "c1", len(P0) + 3)


def test_subagent_interleaved_with_main_agent(make_record):
    sub_sys = [1, 2, 70, 71, 72, 73, 74, 75]
    m0 = make_record(P0, [40, EOT], call_id="m0", started_at=1)
    s0 = make_record(sub_sys + [80], [81, EOT], call_id="s0", started_at=2)
    t0 = make_record(sub_sys + [90], [91, EOT], call_id="t0", started_at=3)  # a parallel sub-agent
    s1 = make_record(sub_sys + [80, 81, EOT, 82], [83, EOT], call_id="s1", started_at=4)
    t1 = make_record(sub_sys + [90, 91, EOT, 92], [93, EOT], call_id="t1", started_at=5)
    m1 = make_record(P0 + [40, EOT, 60], [41, EOT], call_id="m1", started_at=6)
    chains = prefix_merge([m0, s0, t0, s1, t1, m1])
    assert ids(chains) == [["m0", "m1"], ["s0", "s1"], ["t0", "t1"]]
    assert [c.start.kind for c in chains] == ["new", "new", "new"]


def test_subagent_sharing_the_system_prompt_is_not_a_compaction(make_record):
    m0 = make_record(P0, [40, EOT], call_id="m0")
    s0 = make_record(SYS + [80, 81], [82, EOT], call_id="s0")  # same system prompt, own task
    m1 = make_record(P0 + [40, EOT, 60], [41, EOT], call_id="m1")  # the main agent goes on
    chains = prefix_merge([m0, s0, m1])
    assert ids(chains) == [["m0", "m1"], ["s0"]]
    assert chains[1].start == ChainStart("new", None, "m0", len(SYS))


def test_side_call_extending_history_forks_and_main_line_continues(make_record):
    c0 = make_record(P0, [40, EOT], call_id="c0")
    title = make_record(P0 + [40, EOT, 70], [71, EOT], call_id="title")
    c1 = make_record(P0 + [40, EOT, 60], [41, EOT], call_id="c1")
    c2 = make_record(P0 + [40, EOT, 60, 41, EOT, 61], [42, EOT], call_id="c2")
    parents = find_parents([c0, title, c1, c2])
    assert parents == [None, 0, 0, 2]
    assert main_children(parents) == {0: 2, 2: 3}
    chains = prefix_merge([c0, title, c1, c2])
    assert ids(chains) == [["c0", "c1", "c2"], ["title"]]
    assert chains[1].start == ChainStart("fork", None, "c0", len(P0) + 2)


def test_retry_of_the_first_call_is_a_fork(make_record):
    c0 = make_record(P0, [40, EOT], call_id="c0")
    again = make_record(P0, [45, EOT], call_id="again")
    assert prefix_merge([c0, again])[1].start == ChainStart("fork", None, "c0", len(P0))


def test_order_calls_sorts_by_start_and_keeps_file_order_on_ties(make_record):
    a = make_record(P0, [1], call_id="a", started_at=5.0)
    b = make_record(P0, [2], call_id="b", started_at=1.0)
    c = make_record(P0, [3], call_id="c", started_at=5.0)
    assert [r.call_id for r in order_calls([a, b, c])] == ["b", "a", "c"]


@pytest.mark.parametrize("old, new, expected", [
    ([42, 43, EOT], [77, 78, 79, 43, EOT, 50], "retokenized"),
    ([42], [88, EOT, 50], "retokenized"),
    ([300, 301, 302, 303, 304, 305, 306, 307, 308, 309, 40, EOT], [40, EOT, 50], "template"),
])
def test_rerender_reason(old, new, expected):
    assert rerender_reason(old, new) == expected
