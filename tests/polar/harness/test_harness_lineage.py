"""Lineage with the real CLIs (issue 32): Claude Code and OpenCode each call their sub-agent tool once (the
sub-agent makes two shell calls and answers), and OpenCode is driven past its context limit into one
compaction, each through the real proxy (sessions registered in Redis, so a sample is one capture file)
and the reference server with a scripted policy (fixtures/policies/task-subagent.yaml, compact-once.yaml).

Each test checks the run, that every prompt holds what the harness sent (the prompt oracle), that each
trajectory's tokens are exactly the calls' tokens, and the lineage in the table: roles, the parent
trajectory and the spawning call and tool call, compaction segments, weights under --lineage-reward.
"""
from __future__ import annotations

import copy
import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
from transformers import AutoTokenizer

from polar.harness.adapters import AdapterSpec, load_adapter
from polar.report.cli import render_report
from polar.run.session import EngineConfig, RunConfig, RunResult, run_session
from polar.run.services import start_proxy
from polar_traj import read as read_trajectories
from polar_traj.capture_reader import read_capture_dicts
from polar_traj.messages import conversation_messages
from polar_traj.outcomes import AdvantageConfig, parse_outcomes
from polar_traj.pipeline import BuildResult, Selection, build_parquet
from tests.prompt_oracle import assert_prompt_faithful

pytestmark = pytest.mark.slow

SUBAGENT_INSTRUCTION = "Delegate writing sub.txt to a sub-agent."
SUBAGENT_PROMPT = "LINEAGE-SUBTASK: write sub.txt with the shell, two lines, then report."
SUBAGENT_ANSWER = "SUB-ANSWER: sub.txt holds two lines."
COMPACT_INSTRUCTION = "Write polar.txt."
# OpenCode compacts once a call's prompt + output pass limit.context - limit.output: between the first call
# (15.3k prompt + a ~430-token reply) and the continuation (15.4k + 22) of compact-once.yaml.
COMPACT_LIMIT = {"context": 16112, "output": 512}


@dataclass
class LineageRun:
    name: str
    result: RunResult
    records: list[dict[str, Any]]
    rows: list[dict[str, Any]]  # trajectories.parquet of the run (prefix_merge, lineage, no outcomes)


def with_context_limit(spec: AdapterSpec, limit: dict[str, int]) -> AdapterSpec:
    """OpenCode's adapter with a context limit on its model (opencode.json `limit`)."""
    files = []
    for f in spec.files:
        data = copy.deepcopy(f.json)
        if isinstance(data, dict) and "provider" in data:
            for model in data["provider"]["polar"]["models"].values():
                model["limit"] = dict(limit)
        files.append(replace(f, json=data))
    return replace(spec, files=tuple(files))


def one_run(name: str, spec: AdapterSpec, instruction: str, out: Path, backend: str, model: Path, proxy) -> LineageRun:
    cfg = RunConfig(spec, instruction, out, way_in="base_url", timeout_s=300, task_id=f"lineage-{name}")
    result = run_session(cfg, EngineConfig(model, backend=backend), proxy)
    records = [r for f in result.files for r in read_capture_dicts(f)]
    table = out / "trajectories.parquet"
    rows = read_trajectories(table).to_pylist() if table.exists() else []
    return LineageRun(name, result, records, rows)


@pytest.fixture(scope="module")
def runs(tmp_path_factory, start_reference_server, policies_dir, long_model, redis_url, tools_bin):
    for adapter in ("claude-code", "opencode"):
        if not (tools_bin / load_adapter(adapter).package.bin).exists():
            pytest.fail(f"harness CLI {adapter} missing under {tools_bin} (run make setup)")
    tmp = tmp_path_factory.mktemp("lineage")
    sub = start_reference_server(policies_dir / "task-subagent.yaml", long_model)
    compact = start_reference_server(policies_dir / "compact-once.yaml", long_model)
    opencode = load_adapter("opencode")
    plan = {"claude-code": (load_adapter("claude-code"), SUBAGENT_INSTRUCTION, sub),
            "opencode": (opencode, SUBAGENT_INSTRUCTION, sub),
            "opencode-compact": (with_context_limit(opencode, COMPACT_LIMIT), COMPACT_INSTRUCTION, compact)}
    with start_proxy(long_model, sub, tmp / "captures-sub", tmp / "mitm-sub", tmp / "proxy-sub.log", redis_url) as p1, \
            start_proxy(long_model, compact, tmp / "captures-compact", tmp / "mitm-compact", tmp / "proxy-compact.log",
                        redis_url) as p2:
        with ThreadPoolExecutor(3) as pool:
            futures = {name: pool.submit(one_run, name, spec, text, tmp / name, backend, long_model,
                                         p2 if backend == compact else p1)
                       for name, (spec, text, backend) in plan.items()}
    return futures


@pytest.fixture(scope="module")
def tokenizer(long_model):
    return AutoTokenizer.from_pretrained(str(long_model))


def check_run(run: LineageRun, tokenizer, written: dict[str, str]) -> None:
    """Exit 0, the files the shell calls wrote, every prompt faithful to what was sent, every trajectory's
    tokens exactly its calls' tokens."""
    out = run.result.out
    diag = f"{run.name}, run folder {out}:\n{(out / 'harness.stderr').read_text()[-1500:]}"
    assert run.result.exit_code == 0 and not run.result.timed_out, diag
    for name, text in written.items():
        assert (out / "workspace" / name).read_text() == text, diag
    calls = {r["call_id"]: r for r in run.records if r["error"] is None}
    for record in calls.values():
        assert_prompt_faithful(record, tokenizer)
    assert sorted(c for t in run.rows for c in t["call_ids"]) == sorted(calls), "every call in one trajectory"
    for t in run.rows:
        chain = [calls[c] for c in t["call_ids"]]
        assert t["prompt_ids"] + t["response_ids"] == chain[-1]["prompt_ids"] + chain[-1]["output_ids"]
        mask = t["loss_mask"]
        assert [x for x, m in zip(t["response_ids"], mask) if m] == [x for c in chain for x in c["output_ids"]]
        assert [x for x, m in zip(t["logprobs"], mask) if m] == pytest.approx(
            [x for c in chain for x in c["output_logprobs"]], abs=1e-6)


def lineage(row: dict[str, Any]) -> dict[str, Any]:
    return json.loads(row["metadata"])["lineage"]


def reply_of(record: dict[str, Any]) -> dict[str, Any]:
    return conversation_messages(record["api"], {}, record["response"])["messages"][-1]


def rebuild(run: LineageRun, out: Path, mode: str) -> tuple[list[dict[str, Any]], BuildResult]:
    """The run's captures built again with a reward for its session and --lineage-reward MODE."""
    session = run.result.session["session_id"]
    outcomes = parse_outcomes({session: {"reward": 1.0}})
    result = build_parquet(Selection(run.result.files[0]), out, outcomes=outcomes,
                           advantage=AdvantageConfig(lineage_reward=mode))
    return read_trajectories(out).to_pylist(), result


def token_counts(rows: list[dict[str, Any]]) -> tuple[int, int]:
    """(tokens of all rows, tokens of the trained rows: weight > 0)."""
    every = sum(len(t["prompt_ids"]) + len(t["response_ids"]) for t in rows)
    return every, sum(len(t["prompt_ids"]) + len(t["response_ids"]) for t in rows if t["weight"] > 0)


def check_subagent(run: LineageRun, tmp_path: Path) -> None:
    """One main and one sub-agent trajectory: the sub-agent's parent is the main one, its spawning call and
    tool call are the main call that called the sub-agent tool; the parent's later tool result holds the
    sub-agent's answer. Side calls (titles) get weight 0; main-only leaves the sub-agent untrained."""
    by_role: dict[str, list[dict[str, Any]]] = {}
    for t in run.rows:
        by_role.setdefault(lineage(t)["role"], []).append(t)
    assert len(by_role.get("main", [])) == 1 and len(by_role.get("subagent", [])) == 1, \
        {k: [t["call_ids"] for t in v] for k, v in by_role.items()}
    main, sub = by_role["main"][0], by_role["subagent"][0]
    lin = lineage(sub)
    assert lin["parent_trajectory_id"] == main["trajectory_id"]
    assert lin["spawned_by_call_id"] in main["call_ids"]
    calls = {r["call_id"]: r for r in run.records}
    spawn = reply_of(calls[lin["spawned_by_call_id"]])
    [tool_call] = spawn["tool_calls"]
    assert tool_call["function"]["name"] in ("Agent", "Task", "task") and tool_call["id"] == lin["tool_call_id"]
    assert json.loads(tool_call["function"]["arguments"])["prompt"] == SUBAGENT_PROMPT
    assert set(lin["evidence"]) == {"prompt", "result"}
    assert len(sub["call_ids"]) == 3 and reply_of(calls[sub["call_ids"][-1]])["content"] == SUBAGENT_ANSWER
    assert all(lineage(t)["role"] == "side_call" and t["weight"] == 0 for t in by_role.get("side_call", []))

    inherit, built = rebuild(run, tmp_path / "inherit.parquet", "inherit")
    only_main, _ = rebuild(run, tmp_path / "main-only.parquet", "main-only")
    weights = {(lineage(t)["role"], t["trajectory_id"]): (t["weight"], t["advantage"]) for t in inherit}
    assert weights[("subagent", sub["trajectory_id"])] == (1.0, 0.0)  # a group of one: advantage 0.0
    weights = {t["trajectory_id"]: (t["weight"], t["advantage"]) for t in only_main}
    assert weights[sub["trajectory_id"]] == (0.0, None) and weights[main["trajectory_id"]] == (1.0, 0.0)
    assert built.stats.roles["subagent"] == 1 and built.stats.token_ratio > 1
    print(f"\n{run.name}: {built.stats.calls} calls -> {len(run.rows)} trajectories "
          f"{ {k: len(v) for k, v in by_role.items()} }, merge ratio {built.stats.token_ratio:.2f}x; trainer tokens "
          f"all rows {token_counts(inherit)[0]}, inherit {token_counts(inherit)[1]}, "
          f"main-only {token_counts(only_main)[1]}")


def test_claude_code_task_subagent(runs, tokenizer, tmp_path):
    run = runs["claude-code"].result()
    check_run(run, tokenizer, {"sub.txt": "sub\nagain\n"})
    check_subagent(run, tmp_path)


def test_opencode_task_subagent(runs, tokenizer, tmp_path):
    run = runs["opencode"].result()
    check_run(run, tokenizer, {"sub.txt": "sub\nagain\n"})
    check_subagent(run, tmp_path)
    title = [t for t in run.rows if lineage(t)["role"] == "side_call"]
    assert len(title) == 1 and title[0]["weight"] == 0.0, "OpenCode's title call is a side call"


def test_opencode_compaction_two_segments(runs, tokenizer, tmp_path):
    """Segment 0 (the shell call), the summarising call (a chain of its own: another system prompt) kept in
    segment 0 and trainable, segment 1 (the continuation) linked to segment 0; the title call a side call."""
    run = runs["opencode-compact"].result()
    check_run(run, tokenizer, {"polar.txt": "polar\n"})
    rows = {lineage(t)["role"] + ("/summary" if lineage(t)["compaction_summary"] else ""): t for t in run.rows}
    assert sorted(rows) == ["compaction_continuation", "main", "main/summary", "side_call"], \
        [(lineage(t), t["call_ids"]) for t in run.rows]
    main, summary, cont = rows["main"], rows["main/summary"], rows["compaction_continuation"]
    assert lineage(main)["segment"] == 0 and lineage(summary)["segment"] == 0 and lineage(cont)["segment"] == 1
    assert lineage(summary)["parent_trajectory_id"] == main["trajectory_id"]
    assert lineage(cont)["parent_trajectory_id"] == main["trajectory_id"]
    assert "summary" in lineage(cont)["evidence"]
    assert summary["weight"] == 1.0 and cont["weight"] == 1.0 and rows["side_call"]["weight"] == 0.0
    calls = {r["call_id"]: r for r in run.records}
    assert reply_of(calls[summary["call_ids"][0]])["content"].startswith("SUMMARY-OF-WORK")

    inherit, built = rebuild(run, tmp_path / "inherit.parquet", "inherit")
    only_main, _ = rebuild(run, tmp_path / "main-only.parquet", "main-only")
    trained = {t["trajectory_id"] for t in only_main if t["weight"] > 0}
    assert trained == {main["trajectory_id"], summary["trajectory_id"]}
    assert built.stats.roles["compaction_continuation"] == 1
    print(f"\n{run.name}: {built.stats.calls} calls -> {len(run.rows)} trajectories, breaks {built.stats.breaks}, "
          f"merge ratio {built.stats.token_ratio:.2f}x; trainer tokens all rows {token_counts(inherit)[0]}, "
          f"inherit {token_counts(inherit)[1]}, main-only {token_counts(only_main)[1]}")


def test_report_shows_the_lineage_tree(runs):
    """The report of a run draws its session as a tree: the sub-agent nested under the main trajectory."""
    run = runs["claude-code"].result()
    html = render_report(run.result.out)
    section = html[html.index('<section id="lineage">'):]
    section = section[: section.index("</section>")]
    main = next(t for t in run.rows if lineage(t)["role"] == "main")
    sub = next(t for t in run.rows if lineage(t)["role"] == "subagent")
    nested = section.index(main["trajectory_id"]) < section.index(sub["trajectory_id"])
    assert nested and "sub-agents 1," in section and f"tool call {lineage(sub)['tool_call_id']}" in section
    assert section.count("<ul>") >= 2  # the sub-agent's list sits inside the main trajectory's item
