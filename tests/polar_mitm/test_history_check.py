"""A substituted prompt keeps what the model sampled; when that is not what the chat template alone renders from
the request (a harness that drops the reasoning it got, a template that re-renders past turns), the record says
so and by how many tokens (`history_differs_from_template:N`, polar_history_check), so a user can choose."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from transformers import AutoTokenizer

from polar_mitm.launch import ADDON, free_port, stop
from tests.polar_mitm.conftest import start_proxy

TOOLS = [{"type": "function", "function": {"name": "shell", "description": "Run a shell command",
                                           "parameters": {"type": "object", "properties": {
                                               "command": {"type": "string"}}}}}]
THOUGHT = "I will write the file with the shell tool."


@pytest.fixture(scope="module")
def backend(start_reference_server, policies_dir):
    return start_reference_server(policies_dir / "tool-call.yaml")


def session(proxy, name: str, resend_reasoning: bool) -> list[dict]:
    """Two calls: a tool call, then its result with the assistant turn re-sent (with or without its reasoning)."""
    url, headers = f"{proxy.base_url}/v1/chat/completions", {"authorization": f"Bearer {name}"}
    messages = [{"role": "user", "content": "Create polar.txt"}]
    first = httpx.post(url, headers=headers, json={"model": "m", "messages": messages, "tools": TOOLS},
                       timeout=60).json()["choices"][0]["message"]
    assert first["reasoning_content"] == THOUGHT and first["tool_calls"]
    turn = {"role": "assistant", "content": None, "tool_calls": first["tool_calls"]}
    if resend_reasoning:
        turn["reasoning_content"] = first["reasoning_content"]
    messages += [turn, {"role": "tool", "tool_call_id": first["tool_calls"][0]["id"], "content": "done"}]
    second = httpx.post(url, headers=headers, json={"model": "m", "messages": messages, "tools": TOOLS}, timeout=60)
    assert second.status_code == 200, second.text
    records = proxy.records(name)
    assert [r["prefix_source"] for r in records] == ["rendered:first_call", "substituted"]
    return records


@pytest.mark.parametrize("check", ["sampled", "all", "off"])
def test_dropped_reasoning_is_kept_in_the_prompt_and_counted(tmp_path, backend, tiny_model_dir, check):
    proc, proxy = start_proxy(tmp_path, backend, tiny_model_dir, "--set", f"polar_history_check={check}")
    try:
        kept = session(proxy, f"resent-{check}", resend_reasoning=True)
        dropped = session(proxy, f"dropped-{check}", resend_reasoning=False)
    finally:
        stop(proc)
    assert not any(f.startswith("history_differs") for r in kept for f in r["flags"])
    think = AutoTokenizer.from_pretrained(str(tiny_model_dir)).encode(f"<think>\n{THOUGHT}\n</think>\n\n")
    expected = [] if check == "off" else [f"history_differs_from_template:{len(think)}"]
    assert [f for f in dropped[1]["flags"] if f.startswith("history_differs")] == expected
    # the sampled reasoning stays in the prompt: the chain is the model's own tokens
    assert dropped[1]["prompt_ids"][: len(dropped[0]["prompt_ids"]) + len(dropped[0]["output_ids"])] == \
        dropped[0]["prompt_ids"] + dropped[0]["output_ids"]


def test_an_unknown_history_check_is_refused_at_start(tmp_path, tiny_model_dir):
    r = subprocess.run([str(Path(sys.executable).parent / "mitmdump"), "-q", "-s", str(ADDON), "--set",
                        f"polar_tokenizer={tiny_model_dir}", "--set", f"confdir={tmp_path}", "--mode",
                        f"regular@127.0.0.1:{free_port()}", "--set", "polar_history_check=sometimes"],
                       capture_output=True, text=True, timeout=300)
    assert "OptionsError: polar_history_check: expected one of sampled, all, off, got 'sometimes'" in \
        r.stdout + r.stderr, (r.stdout + r.stderr)[-800:]
