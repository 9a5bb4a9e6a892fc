"""The Python side of the harness matrix (issue 15): mini-swe-agent, OpenHands, Aider and Hermes Agent, each from
its own venv (scripts/install_python_harnesses.sh), and OpenClaw on its own Node.js (scripts/install_openclaw.sh),
x both ways in, running the `write-then-finish` scripted policy
through the real proxy and the real reference server, each in its own loopback-only sandbox.

The runs share one reference server and one proxy (sessions in a private Redis) on a small thread pool, as in
test_harness_matrix.py, whose run and checks this file reuses; each test then checks one run: exit 0, the file
written, the recorded calls (each prompt through the prompt oracle), every call's tokens replayed against the
engine, and prefix merging into one trajectory for the agent chain. What differs per harness is how it
writes the file and how it finishes (EXPECT below).
"""
from __future__ import annotations

import json
import re
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

import pytest
from transformers import AutoTokenizer

from polar.harness.adapters import WAYS_IN, AdapterError, available, load_adapter, parse_adapter
from polar.run.session import HARNESS_BIN, RunConfig
from polar.run.services import start_proxy
from polar_traj.messages import conversation_messages
from tests.polar.harness.test_harness_matrix import (
    MatrixRun, _check_agent_trajectory, _check_tokens_exact, agent_calls, check_run, one_run,
)

ROOT = Path(__file__).resolve().parents[3]
INSTALLER = ROOT / "scripts" / "install_python_harnesses.sh"
OPENCLAW_PACKAGE = ROOT / "scripts" / "harnesses" / "openclaw" / "package.json"
WRITE = "echo polar > polar.txt"
# adapter -> (agent calls, how the last agent call finishes): a shell tool call, then the harness's own end.
EXPECT = {
    "openhands": (2, {"tool": "finish", "arguments": {"message": "Done."}}),
    "openclaw": (2, {"content": "Done."}),
    "mini-swe-agent": (2, {"tool": "bash", "arguments": {"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"}}),
    "hermes-agent": (2, {"content": "Done."}),
    "aider": (1, {"content": "polar.txt\n```\npolar\n```"}),  # no tools: one whole-file edit block, then exit
}
ADAPTERS = tuple(EXPECT)  # slowest first: openhands 18k tokens, openclaw 10k, hermes 6.5k, mini 1.8k, aider 0.6k
WORKERS = 3


def installed_pins() -> dict[str, tuple[str, str, str]]:
    """name -> (pypi package, version, command) from the installer's HARNESSES table."""
    rows = re.findall(r'^\s*"([^"|]+)\|([^"|=]+)==([^"|]+)\|([^"|]+)\|[^"]*"', INSTALLER.read_text(), re.M)
    return {name: (package, version, cli) for name, package, version, cli in rows}


def test_adapters_load_and_match_their_installers():
    pins = installed_pins()
    assert set(ADAPTERS) <= set(available())
    for name in ADAPTERS:
        spec = load_adapter(name)
        assert set(spec.ways_in) == set(WAYS_IN)
        package = spec.package
        assert package is not None
        if package.npm is not None:
            pinned = json.loads(OPENCLAW_PACKAGE.read_text())["dependencies"]
            assert pinned.get(package.npm) == package.version, f"{name}: {package} vs {OPENCLAW_PACKAGE}"
        else:
            assert pins[name] == (package.pypi, package.version, package.bin), f"{name}: {package} vs {INSTALLER}"


def test_harnesses_in_their_own_environments_are_on_the_path():
    """Their commands are on the harness PATH the runner builds, apart from the six npm CLIs."""
    spec = load_adapter("mini-swe-agent")
    assert HARNESS_BIN in RunConfig(spec, "x", Path("out")).tools_bin


@pytest.mark.parametrize("package, why", [
    ({"npm": "x", "pypi": "x", "version": "1.0.0", "bin": "x"}, "exactly one of 'npm' or 'pypi'"),
    ({"version": "1.0.0", "bin": "x"}, "exactly one of 'npm' or 'pypi'"),
    ({"pypi": "x", "version": ">=1", "bin": "x"}, "pinned version"),
])
def test_package_needs_one_registry_and_a_pin(package: dict[str, Any], why: str):
    data = {"name": "mine", "api": "openai_chat", "model": "m", "provider": {"url": "https://api.example.com/v1"},
            "ways_in": {"base_url": {}}, "command": ["mine", "{{ instruction }}"], "package": package}
    with pytest.raises(AdapterError, match=re.escape(why)):
        parse_adapter(data, "mine.yaml")


def run_matrix(start_reference_server, policies_dir: Path, long_model: Path, redis_url: str, tmp: Path,
               jobs: dict[Any, tuple[str, str, str]], run: Callable[..., Any], title: str,
               workers: int = WORKERS) -> dict[Any, Future]:
    """Each job (adapter, way in, run folder name) through one reference server (the write-then-finish
    policy) and one proxy, `workers` at a time: its future by key, once all have ended (a failed run's error
    stays in its future, for its own test to report)."""
    missing = sorted({a for a, _, _ in jobs.values() if not (HARNESS_BIN / load_adapter(a).package.bin).exists()})
    if missing:
        pytest.fail(f"harnesses missing under {HARNESS_BIN}: {missing} (run make setup)")
    backend = start_reference_server(policies_dir / "write-then-finish.yaml", long_model, "--threads", "2")
    with start_proxy(long_model, backend, tmp / "captures", tmp / "mitm", tmp / "proxy.log", redis_url) as proxy:
        with ThreadPoolExecutor(workers) as pool:  # leaving the block waits for every run
            futures = {key: pool.submit(run, load_adapter(a), via, tmp / name, backend, long_model, proxy)
                       for key, (a, via, name) in jobs.items()}
    print(f"\nharness matrix, {title} (run wall time with {workers} runs sharing the engine):")
    for key, future in futures.items():
        if future.exception() is None:
            result = future.result()
            print(f"  {jobs[key][2]:28} {result.wall_s:6.1f}s  {len(result.records)} calls")
    return futures


@pytest.fixture(scope="module")
def matrix(tmp_path_factory, start_reference_server, policies_dir, long_model, redis_url):
    jobs = {(a, v): (a, v, f"{a}-{v}") for a in ADAPTERS for v in WAYS_IN}
    return run_matrix(start_reference_server, policies_dir, long_model, redis_url,
                      tmp_path_factory.mktemp("matrix-python"), jobs, one_run, "own environments")


@pytest.fixture(scope="module")
def tokenizer(long_model):
    return AutoTokenizer.from_pretrained(str(long_model))


@pytest.mark.slow
@pytest.mark.parametrize("via", WAYS_IN)
@pytest.mark.parametrize("adapter", ADAPTERS)
def test_write_then_finish(matrix, tokenizer, adapter: str, via: str) -> None:
    run = matrix[(adapter, via)].result()
    diag = check_run(run, tokenizer, adapter, via)
    agent = agent_calls(run.records, run.adapter.shell_tool and run.adapter.shell_tool.name)  # Aider: every call
    calls, finish = EXPECT[adapter]
    assert len(agent) == calls, f"{diag}\nagent calls: {len(agent)}"
    if run.adapter.shell_tool is not None:
        _check_first_call_writes(run, agent[0])
    _check_finish(agent[-1], finish)
    _check_tokens_exact(run)
    _check_agent_trajectory(run, agent)


def _reply(record: dict[str, Any]) -> dict[str, Any]:
    return conversation_messages(record["api"], record["request"], record["response"])["messages"][-1]


def _check_first_call_writes(run: MatrixRun, first: dict[str, Any]) -> None:
    """The first agent call called the harness's own shell tool with its own argument."""
    shell = run.adapter.shell_tool
    calls = _reply(first).get("tool_calls") or []
    assert [c["function"]["name"] for c in calls] == [shell.name], _reply(first)
    assert json.loads(calls[0]["function"]["arguments"])[shell.argument] == WRITE


def _check_finish(last: dict[str, Any], finish: dict[str, Any]) -> None:
    """The last agent call ended the harness's own way: plain text, or its finishing tool call."""
    reply = _reply(last)
    assert reply["role"] == "assistant", reply
    if "content" in finish:
        assert reply["content"] == finish["content"] and not reply.get("tool_calls"), reply
    else:
        calls = reply.get("tool_calls") or []
        assert [c["function"]["name"] for c in calls] == [finish["tool"]], reply
        assert json.loads(calls[0]["function"]["arguments"]) == finish["arguments"]
