"""`polar run` from the command line: a real harness end to end with everything started by the runner (in the
bubblewrap runtime), a custom harness that crashes after two calls, and argument checks."""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from polar.cli import build_parser
from polar.run.causes import cause_lines
from polar.run.cli import reused_proxy
from polar_traj import read as read_trajectories
from polar_traj.capture_reader import read_capture_dicts

ROOT = Path(__file__).resolve().parents[3]

CRASHER = """
import json, os, sys, urllib.request
messages = [{"role": "user", "content": sys.argv[1]}]
for _ in range(2):
    body = json.dumps({"model": "m", "messages": messages, "max_tokens": 32}).encode()
    headers = {"Authorization": "Bearer " + os.environ["KEY"], "Content-Type": "application/json"}
    request = urllib.request.Request(os.environ["BASE"] + "/chat/completions", body, headers)
    reply = json.load(urllib.request.urlopen(request))["choices"][0]["message"]
    messages += [{"role": "assistant", "content": reply["content"]}, {"role": "user", "content": "again"}]
sys.stderr.write("crasher: giving up after two calls\\n"); sys.stderr.flush()
os._exit(3)
"""


def polar_run(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "polar.cli", "run", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)


def test_run_is_registered():
    args = build_parser().parse_args(["run", "--adapter", "pi", "--instruction", "x"])
    assert (args.via, args.runtime, args.timeout, args.backend) == ("https_proxy", "auto", 600.0, None)


@pytest.mark.parametrize("argv, message", [
    (["--proxy", "http://127.0.0.1:1"], "needs --proxy-base-url and --capture-dir"),
    (["--proxy", "http://127.0.0.1:1", "--proxy-base-url", "http://127.0.0.1:2", "--capture-dir", "c",
      "--via", "base_url"], "open mode"),
    (["--proxy", "127.0.0.1", "--proxy-base-url", "http://127.0.0.1:2", "--capture-dir", "c"], "HOST:PORT"),
])
def test_reused_proxy_arguments(argv, message):
    args = build_parser().parse_args(["run", "--adapter", "pi", "--instruction", "x", *argv])
    with pytest.raises(ValueError, match=message):
        reused_proxy(args)


def test_reused_proxy_handle(tmp_path):
    ca = tmp_path / "ca.pem"
    ca.write_text("pem")
    args = argparse.Namespace(proxy="http://127.0.0.1:8080", proxy_base_url="http://127.0.0.1:8081",
                              capture_dir=tmp_path, sessions="unix:///r.sock", via="base_url", proxy_ca=ca,
                              confdir=tmp_path)
    h = reused_proxy(args)
    assert (h.host, h.proxy_port, h.base_url_port, h.ca_cert, h.sessions) == ("127.0.0.1", 8080, 8081, ca,
                                                                              "unix:///r.sock")


def test_sampling_flags_are_checked_before_anything_starts(tmp_path):
    tasks = tmp_path / "tasks.yaml"
    tasks.write_text(yaml.safe_dump({"tasks": [{"task_id": "a", "instruction": "x", "adapter": "pi", "image": "host",
                                                "evaluator": {"command": "true"}, "submit": []}]}))
    done = polar_run("--task", str(tasks), "--temperature", "nan", "--out", str(tmp_path / "out"), timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip() == "polar run: sampling temperature: expected a finite number, got nan"
    assert not (tmp_path / "out").exists()
    # a bare session takes them too (its proxy keeps the session in a private Redis), checked as early
    done = polar_run("--adapter", "pi", "--instruction", "x", "--seed", "-1", "--out", str(tmp_path / "bare"),
                     timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip() == "polar run: sampling seed: expected a whole number >= 0, got -1"
    assert not (tmp_path / "bare").exists()
    args = build_parser().parse_args(["run", "--task", "t.yaml", "--temperature", "0.7", "--top-p", "0.9",
                                      "--top-k", "20", "--max-tokens", "64", "--seed", "3"])
    assert (args.temperature, args.top_p, args.top_k, args.max_tokens, args.seed) == (0.7, 0.9, 20, 64, 3)


def test_bad_adapter_is_a_usage_error():
    done = polar_run("--adapter", "no-such", "--instruction", "x")
    assert done.returncode == 2 and "no such adapter" in done.stderr


def test_a_host_runtime_says_it_does_not_use_the_tasks_image(tmp_path):
    """--runtime bwrap with a task that names an image ran on the host's system and said nothing; now one note
    line says so (here the run then stops at the next check, a backend given without --model); --image host
    is the quiet way to ask for it."""
    tasks = str(ROOT / "fixtures" / "tasks" / "tasks.yaml")
    base = ("--task", tasks, "--task-id", "fix-calc", "--adapter", "pi", "--runtime", "bwrap",
            "--backend", "http://127.0.0.1:9", "--out", str(tmp_path / "out"))
    noted = polar_run(*base)
    assert noted.returncode == 2 and "--model" in noted.stderr, noted.stderr
    assert "polar run: note: --runtime bwrap runs on this host's system, not task fix-calc's image " in noted.stderr
    quiet = polar_run(*base, "--image", "host")
    assert quiet.returncode == 2 and "note:" not in quiet.stderr, quiet.stderr


@pytest.mark.slow
def test_pi_end_to_end_in_bwrap(tmp_path, policies_dir):
    """Everything started by the runner: reference server (shell-once), proxy, pi in bubblewrap."""
    out = tmp_path / "run"
    done = polar_run("--adapter", "pi", "--instruction", "write polar.txt", "--runtime", "bwrap",
                     "--policy", str(policies_dir / "shell-once.yaml"), "--out", str(out),
                     "--confdir", str(tmp_path / "mitm"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "calls: 2 (0 with an error)" in done.stdout and "files changed: added 1" in done.stdout
    assert (out / "workspace" / "polar.txt").read_text() == "polar\n"
    assert "Done." in (out / "harness.stdout").read_text()
    run = json.loads((out / "run.json").read_text())
    assert run["status"] == "completed" and run["exit_code"] == 0 and run["summary"]["trajectories"] == 1
    assert set(run["timings"]) == {"services_s", "harness_s", "build_s", "total_s"}
    harness = json.loads((out / "harness.json").read_text())
    assert "<token>" in harness["env"]["HTTPS_PROXY"] and harness["runtime"] == "bwrap"
    assert (out / "logs" / "proxy.log").exists() and (out / "logs" / "serve.log").exists()


@pytest.mark.slow
@pytest.mark.parametrize("adapter", ["pi", "codex"])
def test_a_harness_through_engine_rendering(tmp_path, policies_dir, adapter):
    """`--render engine`: the reference server's chat endpoint renders and parses; the harness's tool call works
    and every call is recorded with the engine's own prompt ids (polar_mitm/engines/chat.py)."""
    out = tmp_path / "run"
    done = polar_run("--adapter", adapter, "--instruction", "write polar.txt", "--runtime", "bwrap",
                     "--policy", str(policies_dir / "shell-once.yaml"), "--render", "engine", "--out", str(out),
                     "--confdir", str(tmp_path / "mitm"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert (out / "workspace" / "polar.txt").read_text() == "polar\n"
    rows = read_trajectories(out / "trajectories.parquet").to_pylist()
    records = [r for f in sorted((out / "captures").glob("*/*.jsonl")) for r in read_capture_dicts(f)]
    assert len(records) >= 2 and {r["prefix_source"] for r in records} == {"rendered:engine"}, records
    assert all(r["error"] is None and r["output_logprobs"] and len(r["output_logprobs"]) == len(r["output_ids"])
               for r in records)
    assert rows and sum(len(r["response_ids"]) for r in rows) >= sum(len(r["output_ids"]) for r in records) > 0


def test_crashed_harness_keeps_its_calls(tmp_path, start_reference_server, policies_dir, tiny_model_dir):
    backend = start_reference_server(policies_dir / "plain-answer.yaml")
    adapter = tmp_path / "crasher.yaml"
    adapter.write_text(yaml.safe_dump({
        "name": "crasher", "api": "openai_chat", "model": "m",
        "provider": {"url": "https://api.openai.com/v1", "base_path": "/v1"}, "ways_in": {"base_url": {}},
        "command": ["python3", "-c", CRASHER, "{{ instruction }}"],  # the sandbox's system python
        "env": {"BASE": "{{ base_url }}", "KEY": "{{ api_key }}"},
    }))
    out = tmp_path / ("long-" * 16) / "run"  # too long a path for the unix sockets: a short temporary dir serves
    done = polar_run("--adapter", str(adapter), "--instruction", "hello", "--via", "base_url",
                     "--backend", backend, "--model", str(tiny_model_dir), "--out", str(out),
                     "--confdir", str(tmp_path / "mitm"))
    assert done.returncode == 3, done.stdout + done.stderr
    assert "calls: 2 (0 with an error)" in done.stdout
    assert "harness stderr (last lines):\n    crasher: giving up after two calls" in done.stdout  # the cause
    records = [json.loads(line) for f in (out / "captures").glob("*/*.jsonl") for line in f.read_text().splitlines()]
    assert len(records) == 2 and all(r["output_ids"] for r in records)
    run = json.loads((out / "run.json").read_text())
    assert run["status"] == "error" and run["exit_code"] == 3
    rows = read_trajectories(out / "trajectories.parquet").to_pylist()
    assert rows and all(r["status"] == "error" and not any(r["loss_mask"]) for r in rows)
    again = polar_run("--adapter", str(adapter), "--instruction", "hello", "--via", "base_url", "--out", str(out))
    assert again.returncode == 2 and "not empty" in again.stderr


def test_the_cause_of_an_error_is_named(tmp_path):
    """What `polar run` prints under `status error`: the engines the proxy found down, the calls' last error
    (a prompt over the context, both numbers) and the harness's last stderr lines."""
    from polar_traj.records import CallRecord, append_record

    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "proxy.log").write_text("polar proxy: engine http://127.0.0.1:9 down (health probe: "
                                                 "ClientConnectorError)\npolar proxy: engine http://e:1 up\n")
    error = "400 prompt is 17512 tokens; the model's context is 4096 tokens"
    append_record(tmp_path / "captures", CallRecord(
        call_id="c1", task_id="local", session_id="s1", api="openai_chat", model="m", stream=False, started_at=1.0,
        ended_at=2.0, latency_ms=1.0, policy_version=None, prompt_ids=(), output_ids=(), output_logprobs=(),
        finish_reason=None, prefix_source="rendered", parent_call_id=None, request={}, response=None, error=error))
    (tmp_path / "harness.stderr").write_text("".join(f"line {n}\n" for n in range(40)) + "\n\nFatal: no reply\n")
    lines = cause_lines(tmp_path, sorted((tmp_path / "captures").glob("*/*.jsonl")))
    assert lines == ["polar proxy: engine http://127.0.0.1:9 down (health probe: ClientConnectorError)",
                     f"LLM calls with an error: 1; last: {error}", "harness stderr (last lines):",
                     "  line 36", "  line 37", "  line 38", "  line 39", "  Fatal: no reply"]
    assert cause_lines(tmp_path / "nothing", []) == []


def test_a_host_file_the_sandbox_does_not_see_is_named_with_its_fix(tmp_path):
    """A custom agent's script on the host: `python3: can't open file …: No such file or directory` in the
    sandbox; the causes name the file and the two ways in. A system path or the sample's own file is no hint."""
    agent = tmp_path / "mine" / "agent.py"
    agent.parent.mkdir()
    agent.write_text("print('hi')\n")
    out = tmp_path / "run"
    out.mkdir()
    (out / "workspace").mkdir()
    (out / "workspace" / "x.txt").write_text("")
    (out / "harness.stderr").write_text(
        f"python3: can't open file '{agent}': [Errno 2] No such file or directory\n"
        "/usr/bin/env: 'python': No such file or directory\n"
        f"cat: {out / 'workspace' / 'x.txt'}: No such file or directory\n")
    hints = [line for line in cause_lines(out, []) if "does not see" in line]
    assert hints == [f"{agent} is a file on this host, which the sandbox does not see: list it under the adapter's "
                     "`files:` (copied into the sandbox; adapters/README.md) or run with --runtime local (no "
                     "isolation)"]


def test_progress_counts_the_calls_and_tokens_so_far(tmp_path):
    from polar.run.cli import Progress

    (tmp_path / "t1").mkdir()
    (tmp_path / "t1" / "s1.jsonl").write_text('{"output_ids": [1, 2, 3]}\n{"output_ids": [4]}\n')
    s2 = tmp_path / "t1" / "s2.jsonl"
    s2.write_text('{"output_ids": [5, 6]}\n{"output_ids": [7')  # its second line is still being written
    with Progress(tmp_path) as progress:
        assert progress.line().startswith("polar run: 3 LLM calls so far, 6 tokens sampled, ")
        with s2.open("a") as f:
            f.write(', 8]}\n')
        assert progress.line().startswith("polar run: 4 LLM calls so far, 8 tokens sampled, ")  # counted once
    assert Progress(None).line().startswith("polar run: 0 LLM calls so far")
