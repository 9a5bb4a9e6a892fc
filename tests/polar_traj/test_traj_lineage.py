"""Lineage on hand-built sessions (the real-CLI runs are tests/polar/harness/test_harness_lineage.py): a
sub-agent found by its spawn tool call, a compaction continuation, side calls at weight 0, and the weights
and advantages of --lineage-reward inherit|main-only."""
from __future__ import annotations

import json

import pytest

from polar_traj.build import BuildConfig
from polar_traj.outcomes import AdvantageConfig, parse_outcomes
from polar_traj.pipeline import Selection, iter_trajectories

SHELL = {"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}
TASK = {"type": "function", "function": {"name": "task", "parameters": {"type": "object"}}}
SUB_PROMPT = "Look at calc.py and report what is wrong."
SUB_ANSWER = "calc.py subtracts where it should add."
SUMMARY = "SUMMARY: the bug is a minus sign in calc.py line 3; the fix is still to be written."


def chat(messages: list[dict], tools: list[dict] | None = None) -> dict:
    return {"model": "tiny", "messages": messages, **({"tools": tools} if tools else {})}


def reply(content: str = "", tool_calls: list[dict] | None = None) -> dict:
    message = {"role": "assistant", "content": content, **({"tool_calls": tool_calls} if tool_calls else {})}
    return {"choices": [{"message": message}]}


def tool_call(call_id: str, name: str, **arguments: str) -> dict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


def subagent_session(make_record) -> list:
    system, user = {"role": "system", "content": "You are an agent."}, {"role": "user", "content": "Fix calc.py"}
    spawn = tool_call("tc-1", "task", prompt=SUB_PROMPT, description="look")
    m0 = make_record(range(1, 9), [20, 21, 99], call_id="m0", started_at=1.0,
                     request=chat([system, user], [SHELL, TASK]), response=reply(tool_calls=[spawn]))
    title = make_record([700, 701], [702, 99], call_id="title", started_at=1.2,
                        request=chat([{"role": "system", "content": "Write a title."}, user]), response=reply("Calc"))
    sub_user = {"role": "user", "content": SUB_PROMPT}
    s0 = make_record(range(300, 310), [40, 99], call_id="s0", started_at=2.0,
                     request=chat([system, sub_user], [SHELL]), response=reply(tool_calls=[tool_call("b1", "bash")]))
    s1 = make_record([*range(300, 310), 40, 99, 50, 51], [41, 99], call_id="s1", started_at=3.0,
                     request=chat([system, sub_user, {"role": "assistant", "content": "", "tool_calls": [
                         tool_call("b1", "bash")]}, {"role": "tool", "tool_call_id": "b1", "content": "x"}], [SHELL]),
                     response=reply(SUB_ANSWER))
    m1 = make_record([*range(1, 9), 20, 21, 99, 60, 61], [22, 99], call_id="m1", started_at=4.0,
                     request=chat([system, user, {"role": "assistant", "content": "", "tool_calls": [spawn]},
                                   {"role": "tool", "tool_call_id": "tc-1", "content": f"Result: {SUB_ANSWER}"}],
                                  [SHELL, TASK]), response=reply("Done."))
    return [m0, title, s0, s1, m1]


def compaction_session(make_record) -> list:
    """Claude Code style: the summary call extends the history; the continuation opens with the summary."""
    system, user = {"role": "system", "content": "You are an agent."}, {"role": "user", "content": "Fix calc.py"}
    c0 = make_record(range(1, 9), [20, 99], call_id="c0", started_at=1.0, request=chat([system, user], [SHELL]),
                     response=reply(tool_calls=[tool_call("b1", "bash")]))
    summarise = {"role": "user", "content": "Summarize the conversation so far."}
    c1 = make_record([*range(1, 9), 20, 99, 30, 31], [21, 22, 99], call_id="c1", started_at=2.0,
                     request=chat([system, user, summarise], [SHELL]), response=reply(SUMMARY))
    opening = {"role": "user", "content": "This session is being continued from a previous conversation that ran "
                                          f"out of context. The conversation is summarized below: {SUMMARY}"}
    c2 = make_record(range(400, 410), [23, 99], call_id="c2", started_at=3.0, request=chat([system, opening], [SHELL]),
                     response=reply(tool_calls=[tool_call("b2", "bash")]))
    c3 = make_record([*range(400, 410), 23, 99, 32], [24, 99], call_id="c3", started_at=4.0,
                     request=chat([system, opening], [SHELL]), response=reply("Done."))
    return [c0, c1, c2, c3]


def built(tmp_path, write_records, records, outcomes=None, **advantage) -> dict[str, object]:
    write_records(tmp_path, records)
    rows = iter_trajectories(Selection(tmp_path), outcomes=outcomes, advantage=AdvantageConfig(**advantage))
    return {t.call_ids[0]: t for t in rows}


def test_subagent_points_at_the_spawning_call_and_tool_call(tmp_path, make_record, write_records):
    rows = built(tmp_path, write_records, subagent_session(make_record))
    assert sorted(rows) == ["m0", "s0", "title"] and rows["m0"].call_ids == ["m0", "m1"]
    sub = rows["s0"].metadata["lineage"]
    assert sub == {"role": "subagent", "parent_trajectory_id": rows["m0"].trajectory_id, "spawned_by_call_id": "m0",
                   "tool_call_id": "tc-1", "segment": 0, "evidence": ["prompt", "result"],
                   "compaction_summary": False}
    assert rows["m0"].metadata["lineage"]["role"] == "main"
    assert rows["title"].metadata["lineage"]["role"] == "side_call" and rows["title"].weight == 0.0
    assert rows["m0"].weight == rows["s0"].weight == 1.0


@pytest.mark.parametrize("mode, sub_weight, sub_advantage", [("inherit", 0.5, 0.5), ("main-only", 0.0, None)])
def test_lineage_reward_modes(tmp_path, make_record, write_records, mode, sub_weight, sub_advantage):
    """Two sessions of one task (rewards 1 and 0): the sub-agent inherits its session's advantage, or with
    main-only is left untrained; weight=session divides by the trained rows only; side calls never train."""
    records = subagent_session(make_record)
    other = [make_record([5, 6], [7, 99], call_id="o0", session_id="other", request=chat(
        [{"role": "user", "content": "Fix calc.py"}], [SHELL]), response=reply("Done."))]
    outcomes = parse_outcomes({"sess": 1.0, "other": 0.0})
    rows = built(tmp_path, write_records, records + other, outcomes, lineage_reward=mode, weight="session")
    assert (rows["s0"].weight, rows["s0"].advantage) == (sub_weight, sub_advantage)
    assert (rows["m0"].weight, rows["m0"].advantage) == (0.5 if mode == "inherit" else 1.0, 0.5)
    assert (rows["title"].weight, rows["title"].advantage) == (0.0, None)
    assert rows["s0"].reward == 1.0
    untrained = rows["s0"].metadata["outcome"].get("untrained_by_lineage")
    assert untrained == (None if mode == "inherit" else "main-only")


def test_compaction_continuation_is_segment_one_of_the_summarised_chain(tmp_path, make_record, write_records):
    rows = built(tmp_path, write_records, compaction_session(make_record))
    assert rows["c0"].call_ids == ["c0", "c1"], "the summarising call stays in the earlier segment"
    assert rows["c0"].metadata["lineage"]["role"] == "main" and rows["c0"].weight == 1.0
    cont = rows["c2"].metadata["lineage"]
    assert (cont["role"], cont["segment"], cont["parent_trajectory_id"]) == (
        "compaction_continuation", 1, rows["c0"].trajectory_id)
    assert cont["evidence"] == ["summary", "marker"] and rows["c2"].call_ids == ["c2", "c3"]


def test_a_toolless_agent_that_is_no_title_or_classifier_stays_main(tmp_path, make_record, write_records):
    """A framework's reviewer agent offers no tools but is the agents' work: main, weight 1."""
    records = subagent_session(make_record)[:1] + [make_record(
        [800, 801], [802, 99], call_id="review", started_at=5.0, response=reply("Approved."),
        request=chat([{"role": "system", "content": "You review a coder's work."}, {"role": "user", "content": "x"}]))]
    rows = built(tmp_path, write_records, records)
    assert rows["review"].metadata["lineage"]["role"] == "main" and rows["review"].weight == 1.0


def test_a_session_without_tools_is_all_main(tmp_path, make_record, write_records):
    """No chain offers tools (a plain chat harness): nothing is a side call, every row keeps weight 1."""
    records = [make_record([1, 2], [3, 99], call_id="p0", response=reply("hello")),
               make_record([8, 9], [3, 99], call_id="p1", response=reply("again"))]
    rows = built(tmp_path, write_records, records)
    assert {t.metadata["lineage"]["role"] for t in rows.values()} == {"main"}
    assert {t.weight for t in rows.values()} == {1.0}


def test_stats_count_roles_per_session(tmp_path, make_record, write_records):
    from polar_traj.analysis import lineage_by_session
    from polar_traj.pipeline import build_parquet

    write_records(tmp_path / "caps", subagent_session(make_record))
    result = build_parquet(Selection(tmp_path / "caps"), tmp_path / "t.parquet")
    assert result.stats.roles == {"main": 1, "subagent": 1, "compaction_continuation": 0, "side_call": 1}
    assert any(line.startswith("lineage: main 1, subagent 1") for line in result.stats.summary_lines())
    table = lineage_by_session(tmp_path / "t.parquet")
    row = table.loc["sess"]
    counts = (row["trajectories"], row["main"], row["subagents"], row["compactions"], row["side_calls"])
    assert counts == (3, 1, 1, 0, 1)
    assert row["trained_tokens"] == row["tokens"] - 4  # the title call's 2 + 2 tokens are not trained


def test_per_request_rows_take_their_chains_lineage(tmp_path, make_record, write_records):
    write_records(tmp_path, subagent_session(make_record))
    rows = {t.call_ids[0]: t for t in iter_trajectories(Selection(tmp_path), BuildConfig(strategy="per_request"))}
    assert {c: rows[c].metadata["lineage"]["role"] for c in rows} == {
        "m0": "main", "m1": "main", "title": "side_call", "s0": "subagent", "s1": "subagent"}
    assert rows["s1"].metadata["lineage"]["parent_trajectory_id"] == rows["m0"].trajectory_id


def test_cli_lineage_reward_and_stats(tmp_path, make_record, write_records, capsys):
    from polar.cli import main
    from polar_traj.parquet import read

    write_records(tmp_path / "caps", subagent_session(make_record))
    out = tmp_path / "t.parquet"
    assert main(["traj", "build", str(tmp_path / "caps"), "-o", str(out), "--lineage-reward", "main-only"]) == 0
    assert "lineage: main 1, subagent 1, compaction_continuation 0, side_call 1" in capsys.readouterr().out
    assert sorted(read(out).column("weight").to_pylist()) == [0.0, 0.0, 1.0]
    assert main(["traj", "stats", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "lineage by session" in printed and "subagents" in printed and "side_calls" in printed
    with pytest.raises(SystemExit) as e:  # argparse: one usage line and exit 2
        main(["traj", "build", str(tmp_path / "caps"), "-o", str(out), "--lineage-reward", "all"])
    assert e.value.code == 2 and "invalid choice: 'all'" in capsys.readouterr().err
