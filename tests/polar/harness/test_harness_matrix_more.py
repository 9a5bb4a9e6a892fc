"""The harnesses of issue 33, each with one real run through the real proxy and the real reference server
(`write-then-finish` policy), in its own loopback-only sandbox: five more coding CLIs (Cline, Kilo Code,
Continue, Grok CLI, Nanocoder; scripts/install_more_harnesses.sh) and three agent frameworks run as harnesses
(adapters/frameworks/: OpenAI Agents SDK with a handoff, smolagents, LangGraph with two agents that talk;
their venvs from scripts/install_python_harnesses.sh).

One reference server and one proxy (sessions in a private Redis) serve all runs on a small thread pool, as in
test_harness_matrix.py. Each test checks one run: exit 0, polar.txt written and nothing else, no error
record, every prompt through the prompt oracle, every call's tokens replayed against the engine, and one
trajectory per agent loop: for a framework, one per agent, named by `metadata.agent`.
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from transformers import AutoTokenizer

from polar.harness.adapters import AdapterSpec, load_adapter
from polar.run.session import EngineConfig, RunConfig, run_session
from polar_traj import read as read_trajectories
from polar_traj.capture_reader import read_capture_dicts
from polar_traj.messages import conversation_messages
from tests.prompt_oracle import assert_prompt_faithful
from tests.polar.harness.test_harness_matrix import INSTRUCTION, MatrixRun, _check_tokens_exact, replay
from tests.polar.harness.test_harness_matrix_python import installed_pins, run_matrix

ROOT = Path(__file__).resolve().parents[3]
MORE_PACKAGE = ROOT / "scripts" / "harnesses" / "more" / "package.json"
WRITE = "echo polar > polar.txt"
DONE = {"content": "Done."}
# adapter -> (the way in of its one run, {agent: (calls in its chain, how its last call ends)}). A CLI's agent
# is None (its requests name none; its loop is the calls that offer its shell tool); a framework's are named.
RUNS: dict[str, tuple[str, dict[str | None, tuple[int, dict[str, Any]]]]] = {
    "kilo": ("base_url", {None: (2, DONE)}),  # slowest first: a 26k-token prompt; then light and long in turn
    "continue": ("https_proxy", {None: (2, DONE)}),
    "cline": ("https_proxy", {None: (2, DONE)}),
    "grok-cli": ("base_url", {None: (2, DONE)}),
    "nanocoder": ("base_url", {None: (2, DONE)}),
    "openai-agents": ("base_url", {"triage": (1, {"tool": "transfer_to_coder", "arguments": {}}),
                                   "coder": (2, DONE)}),
    "langgraph": ("base_url", {"coder": (2, DONE), "reviewer": (1, {"content": "Approved."})}),
    # smolagents re-sends its history as text turns: each call starts a chain of its own (below)
    "smolagents": ("base_url", {"coder": (2, {"tool": "final_answer", "arguments": {"answer": "Done."}})}),
}
FRAMEWORKS = ("openai-agents", "langgraph", "smolagents")
# files a harness itself writes into the workspace besides the task's (both hard-wired to the working directory)
OWN_FILES = {"nanocoder": [".nanocoder/tasks.json"], "grok-cli": [".grok/settings.json"]}
WORKERS = 2  # kilo's 26k-token prefill starves a third stream on a loaded 2-core machine (engine chunk timeout)


def run_one(spec: AdapterSpec, via: str, out: Path, backend: str, model: Path, proxy) -> MatrixRun:
    start = time.monotonic()
    cfg = RunConfig(spec, INSTRUCTION, out, way_in=via, timeout_s=300, task_id="matrix-more")
    result = run_session(cfg, EngineConfig(model, backend=backend), proxy)
    wall = time.monotonic() - start
    records = [r for f in result.files for r in read_capture_dicts(f)]  # whole requests, either capture format
    replays = [(r, replay(backend, r)) for r in records if r["error"] is None]
    return MatrixRun(spec, via, result, records, replays, wall)


def test_adapters_match_their_installers():
    """Each CLI is pinned in the `more` npm prefix, each framework in the Python installer's table."""
    npm = json.loads(MORE_PACKAGE.read_text())["dependencies"]
    pins = installed_pins()
    for name in RUNS:
        spec = load_adapter(name)
        package = spec.package
        assert package is not None and RUNS[name][0] in spec.ways_in
        if package.npm is not None:
            assert npm.get(package.npm) == package.version, f"{name}: {package} vs {MORE_PACKAGE}"
        else:
            pypi, version, cli = pins[name]
            assert (pypi.split("[")[0], version.split()[0], cli) == (package.pypi, package.version, package.bin)


@pytest.fixture(scope="module")
def matrix(tmp_path_factory, start_reference_server, policies_dir, long_model, redis_url):
    jobs = {a: (a, via, a) for a, (via, _agents) in RUNS.items()}
    return run_matrix(start_reference_server, policies_dir, long_model, redis_url,
                      tmp_path_factory.mktemp("matrix-more"), jobs, run_one, "issue 33", WORKERS)


@pytest.fixture(scope="module")
def tokenizer(long_model):
    return AutoTokenizer.from_pretrained(str(long_model))


@pytest.mark.slow
@pytest.mark.parametrize("adapter", RUNS)
def test_write_then_finish(matrix, tokenizer, adapter: str) -> None:
    run = matrix[adapter].result()
    via, agents = RUNS[adapter]
    diag = _check_run(run, tokenizer, adapter, via)
    _check_tokens_exact(run)
    table = read_trajectories(run.result.out / "trajectories.parquet").to_pylist()
    chains = []
    for agent, (calls, finish) in agents.items():
        mine = _calls_of(run, agent)
        assert len(mine) == calls, f"{diag}\n{agent}: {len(mine)} calls"
        if adapter == "smolagents":
            chains += _check_broken_chains(table, mine, agent)
        else:
            chains.append(_check_chain(table, mine, agent))
        _check_finish(mine[-1], finish)
    if run.adapter.shell_tool is not None:
        _check_first_write(run, _calls_of(run, None if adapter not in FRAMEWORKS else "coder")[0])
    side = [t for t in table if t["trajectory_id"] not in chains]
    assert all(len(t["call_ids"]) == 1 for t in side), "side calls (titles) are single-call chains"


def _check_run(run: MatrixRun, tokenizer, adapter: str, via: str) -> str:
    """Exit 0, polar.txt written and nothing else (but the harness's own files), no error record, each prompt
    holding what the harness sent (the prompt oracle, apart from polar_mitm). Returns the diagnostic text."""
    out = run.result.out
    diag = f"{adapter} via {via}, run folder {out}:\n{(out / 'harness.stderr').read_text()[-1500:]}"
    assert run.result.exit_code == 0 and not run.result.timed_out, diag
    assert (out / "workspace" / "polar.txt").read_text() == "polar\n", diag
    assert run.result.summary.files_changed["added"] == sorted(["polar.txt", *OWN_FILES.get(adapter, [])]), diag
    for record in run.records:
        if record["error"] == "client disconnected" and not _offers_shell(run, record):
            continue  # a side call the harness dropped as it exited (kilo's title, when the engine is quick)
        assert record["error"] is None, f"unexpected error record: {record['error']}"
        assert_prompt_faithful(record, tokenizer)
    return diag


def _offers_shell(run: MatrixRun, record: dict[str, Any]) -> bool:
    shell = run.adapter.shell_tool
    tools = conversation_messages(record["api"], record["request"], None)["tools"]
    return shell is None or shell.name in {t.get("function", {}).get("name") for t in tools}


def _agent_of(record: dict[str, Any]) -> str | None:
    tags = record["request"].get("metadata")
    return tags.get("agent") if isinstance(tags, dict) else None


def _calls_of(run: MatrixRun, agent: str | None) -> list[dict[str, Any]]:
    """A framework agent's calls (its requests' metadata.agent); for a CLI, the calls offering its shell tool."""
    if agent is not None:
        return [r for r in run.records if r["error"] is None and _agent_of(r) == agent]
    return [r for r in run.records if r["error"] is None and _offers_shell(run, r)]


def _reply(record: dict[str, Any]) -> dict[str, Any]:
    return conversation_messages(record["api"], record["request"], record["response"])["messages"][-1]


def _check_first_write(run: MatrixRun, first: dict[str, Any]) -> None:
    """The first agent call called the harness's own shell tool with its own argument (Cline's is a list)."""
    shell = run.adapter.shell_tool
    calls = _reply(first).get("tool_calls") or []
    assert [c["function"]["name"] for c in calls] == [shell.name], _reply(first)
    assert json.loads(calls[0]["function"]["arguments"])[shell.argument] in (WRITE, [WRITE])


def _check_finish(last: dict[str, Any], finish: dict[str, Any]) -> None:
    reply = _reply(last)
    assert reply["role"] == "assistant", reply
    if "content" in finish:
        assert reply["content"] == finish["content"] and not reply.get("tool_calls"), reply
    else:
        calls = reply.get("tool_calls") or []
        assert [c["function"]["name"] for c in calls] == [finish["tool"]], reply
        assert json.loads(calls[0]["function"]["arguments"]) == finish["arguments"]


def _check_chain(table: list[dict[str, Any]], calls: list[dict[str, Any]], agent: str | None) -> str:
    """One trajectory holds exactly this agent's calls, names the agent, and its mask-1 tokens and logprobs
    are the sampled ones; prompt + response is the last call's prompt + output. Returns its id."""
    ids = [r["call_id"] for r in calls]
    holders = [t for t in table if set(ids) & set(t["call_ids"])]
    assert len(holders) == 1 and holders[0]["call_ids"] == ids, [t["call_ids"] for t in table]
    traj = holders[0]
    assert traj["strategy"] == "prefix_merge" and traj["status"] == "completed"
    assert json.loads(traj["metadata"]).get("agent") == agent
    mask = traj["loss_mask"]
    assert [t for t, m in zip(traj["response_ids"], mask) if m == 1] == [t for r in calls for t in r["output_ids"]]
    assert [lp for lp, m in zip(traj["logprobs"], mask) if m == 1] == pytest.approx(
        [lp for r in calls for lp in r["output_logprobs"]], abs=1e-6)
    assert traj["prompt_ids"] + traj["response_ids"] == calls[-1]["prompt_ids"] + calls[-1]["output_ids"]
    return traj["trajectory_id"]


def _check_broken_chains(table: list[dict[str, Any]], calls: list[dict[str, Any]], agent: str) -> list[str]:
    """smolagents sends its earlier tool calls and results back as plain text turns, so no prompt extends the
    tokens sampled before it: each call is a chain of its own (a `template` break), exact all the same."""
    ids = []
    for i, record in enumerate(calls):
        ids.append(_check_chain(table, [record], agent))
        start = json.loads(next(t for t in table if t["trajectory_id"] == ids[-1])["metadata"])["chain_start"]
        assert (start["kind"], start["reason"]) == (("new", None) if i == 0 else ("break", "template")), start
    return ids
