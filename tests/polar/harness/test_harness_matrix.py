"""The six real harness CLIs x both ways in, each running the `shell-once` scripted policy through the real proxy
and the real reference server, each in its own loopback-only sandbox (issue 5).

All twelve runs share one reference server and one proxy (sessions registered in a private Redis) and run on a
small thread pool; each test then checks one run: exit 0, the file the shell tool wrote, the recorded calls,
every call's tokens replayed against the engine, and prefix merging into one trajectory for the agent chain.
"""
from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from transformers import AutoTokenizer

from polar.harness.adapters import WAYS_IN, AdapterSpec, available, load_adapter
from polar.run.session import EngineConfig, RunConfig, RunResult, run_session
from polar.run.services import start_proxy
from polar_traj import read as read_trajectories
from polar_traj.messages import conversation_messages
from polar_traj.capture_reader import read_capture_dicts
from tests.prompt_oracle import assert_prompt_faithful

pytestmark = pytest.mark.slow

# Longest prompts first, so the pool does not end on one long run (qwen 36k tokens, claude 26k, gemini 24k).
ADAPTERS = ("qwen-code", "claude-code", "gemini-cli", "opencode", "codex", "pi")
INSTRUCTION = "Create the file polar.txt containing the word polar, using the shell."
WORKERS = 3  # harness start-up (node) overlaps the engine; the engine (2 torch threads) serves one token at a time


@dataclass
class MatrixRun:
    adapter: AdapterSpec
    via: str
    result: RunResult
    records: list[dict[str, Any]]
    replays: list[tuple[dict[str, Any], dict[str, Any]]]  # (record, engine reply) per call without error
    wall_s: float


def replay(backend: str, record: dict[str, Any]) -> dict[str, Any]:
    """The record's prompt ids again through the engine, greedy, as many new tokens as it sampled."""
    body = {"input_ids": record["prompt_ids"], "return_logprob": True,
            "sampling_params": {"max_new_tokens": len(record["output_ids"]), "temperature": 0.0,
                                "skip_special_tokens": False}}
    response = httpx.post(f"{backend}/generate", json=body, timeout=600)
    response.raise_for_status()
    return response.json()


def one_run(spec: AdapterSpec, via: str, out: Path, backend: str, model: Path, proxy) -> MatrixRun:
    start = time.monotonic()
    cfg = RunConfig(spec, INSTRUCTION, out, way_in=via, timeout_s=300, task_id="matrix")
    result = run_session(cfg, EngineConfig(model, backend=backend), proxy)
    wall = time.monotonic() - start
    records = [r for f in result.files for r in read_capture_dicts(f)]
    replays = [(r, replay(backend, r)) for r in records if r["error"] is None]
    return MatrixRun(spec, via, result, records, replays, wall)


@pytest.fixture(scope="module")
def matrix(tmp_path_factory, start_reference_server, policies_dir, long_model, redis_url, tools_bin):
    missing = [a for a in ADAPTERS if not (tools_bin / load_adapter(a).package.bin).exists()]
    if missing:
        pytest.fail(f"harness CLIs missing under {tools_bin}: {missing} (run make setup)")
    backend = start_reference_server(policies_dir / "shell-once.yaml", long_model, "--threads", "2")
    tmp = tmp_path_factory.mktemp("matrix")
    with start_proxy(long_model, backend, tmp / "captures", tmp / "mitm", tmp / "proxy.log", redis_url) as proxy:
        with ThreadPoolExecutor(WORKERS) as pool:  # leaving the block waits for every run
            futures = {(a, v): pool.submit(one_run, load_adapter(a), v, tmp / f"{a}-{v}", backend, long_model, proxy)
                       for a in ADAPTERS for v in WAYS_IN}
    print("\nharness matrix (run wall time with 3 runs sharing the engine; calls incl. error records):")
    for (a, v), future in futures.items():
        if future.exception() is None:
            run = future.result()
            print(f"  {a:12} {v:12} {run.wall_s:6.1f}s  {len(run.records)} calls")
    return futures  # each test takes its own result: one failed run fails one test


@pytest.fixture(scope="module")
def tokenizer(long_model):
    return AutoTokenizer.from_pretrained(str(long_model))


def test_matrix_covers_every_adapter():
    assert set(ADAPTERS) <= set(available())


def check_run(run, tokenizer, adapter: str, via: str) -> str:
    """What every harness run must show: exit 0, polar.txt written and nothing else, no error records, each
    prompt holding what the harness sent (an oracle apart from polar_mitm). Returns the diagnostic text."""
    out = run.result.out
    diag = f"{adapter} via {via}, run folder {out}:\n{(out / 'harness.stderr').read_text()[-1500:]}"
    assert run.result.exit_code == 0 and not run.result.timed_out, diag
    assert (out / "workspace" / "polar.txt").read_text() == "polar\n", diag
    assert run.result.summary.files_changed["added"] == ["polar.txt"], diag
    _check_errors(run)
    for record in run.records:
        assert_prompt_faithful(record, tokenizer)
    return diag


@pytest.mark.parametrize("via", WAYS_IN)
@pytest.mark.parametrize("adapter", ADAPTERS)
def test_shell_once(matrix, tokenizer, adapter: str, via: str) -> None:
    run = matrix[(adapter, via)].result()
    diag = check_run(run, tokenizer, adapter, via)
    agent = agent_calls(run.records, run.adapter.shell_tool.name)
    assert len(agent) >= 2, f"{diag}\nagent calls: {len(agent)}"
    _check_shell_call(run, agent)
    _check_tokens_exact(run)
    _check_agent_trajectory(run, agent)


def _check_errors(run: MatrixRun) -> None:
    for r in run.records:
        assert r["error"] is None, f"unexpected error record: {r['error']}"


def agent_calls(records: list[dict[str, Any]], shell: str | None) -> list[dict[str, Any]]:
    """Calls without error that offer the harness's shell tool (side calls such as titles offer none); for a
    harness without tools (`shell` None), every call without error."""
    def offers(r: dict[str, Any]) -> bool:
        tools = conversation_messages(r["api"], r["request"], None)["tools"]
        return shell in {t.get("function", {}).get("name") for t in tools}
    return [r for r in records if r["error"] is None and (shell is None or offers(r))]


def _check_shell_call(run: MatrixRun, agent: list[dict[str, Any]]) -> None:
    """The first agent call called the harness's own shell tool with its own argument; the last said Done."""
    shell = run.adapter.shell_tool
    first = conversation_messages(agent[0]["api"], agent[0]["request"], agent[0]["response"])["messages"][-1]
    calls = first.get("tool_calls") or []
    assert [c["function"]["name"] for c in calls] == [shell.name], first
    assert json.loads(calls[0]["function"]["arguments"])[shell.argument] == "echo polar > polar.txt"
    last = conversation_messages(agent[-1]["api"], agent[-1]["request"], agent[-1]["response"])["messages"][-1]
    assert last["role"] == "assistant" and last["content"] == "Done." and not last.get("tool_calls"), last


def _check_tokens_exact(run: MatrixRun) -> None:
    """Every recorded call, replayed from its prompt ids, gives the same ids and logprobs."""
    assert run.replays
    for record, engine in run.replays:
        assert_replayed(record, engine)


def assert_replayed(record: dict[str, Any], engine: dict[str, Any]) -> None:
    """The engine's greedy replay of a record's prompt (`replay`) gave the record's ids and logprobs."""
    assert engine["meta_info"]["prompt_tokens"] == len(record["prompt_ids"])
    assert engine["output_ids"] == record["output_ids"], record["call_id"]
    logprobs = [lp for lp, _tok, _text in engine["meta_info"]["output_token_logprobs"]]
    assert logprobs == pytest.approx(record["output_logprobs"], abs=1e-5), record["call_id"]


def _check_agent_trajectory(run: MatrixRun, agent: list[dict[str, Any]]) -> None:
    """Prefix merging puts the whole agent chain in one trajectory; its mask-1 tokens are the sampled ones."""
    table = read_trajectories(run.result.out / "trajectories.parquet").to_pylist()
    ids = [r["call_id"] for r in agent]
    holders = [t for t in table if set(ids) & set(t["call_ids"])]
    assert len(holders) == 1 and holders[0]["call_ids"] == ids, [t["call_ids"] for t in table]
    traj = holders[0]
    assert traj["strategy"] == "prefix_merge" and traj["status"] == "completed"
    sampled = [t for r in agent for t in r["output_ids"]]
    logprobs = [lp for r in agent for lp in r["output_logprobs"]]
    mask = traj["loss_mask"]
    assert [t for t, m in zip(traj["response_ids"], mask) if m == 1] == sampled
    assert [lp for lp, m in zip(traj["logprobs"], mask) if m == 1] == pytest.approx(logprobs, abs=1e-6)
    assert traj["prompt_ids"] + traj["response_ids"] == agent[-1]["prompt_ids"] + agent[-1]["output_ids"]
    side = [t for t in table if t is not traj]
    assert all(len(t["call_ids"]) == 1 for t in side), "side calls are single-call chains"
