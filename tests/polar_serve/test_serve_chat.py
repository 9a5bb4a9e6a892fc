"""The reference server's chat endpoint (polar_serve/api_chat.py), as a real process over real HTTP: its prompt is
the chat template's own rendering, its numbers equal a plain forward pass, a scripted reply comes back parsed
(reasoning and tool calls), the stream carries the same ids, and history tool calls given as JSON text render as
the template renders objects."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.polar_serve.test_serve_http import MESSAGES, events, generate, post, triples

TOOLS = [{"type": "function", "function": {"name": "Bash", "parameters": {"type": "object"}}}]


def chat(base: str, **body) -> dict:
    r = post(base, "/v1/chat/completions", {"return_token_ids": True, "logprobs": True, **body})
    assert r.status_code == 200, r.text
    return r.json()


def test_a_chat_call_is_the_templates_prompt_and_the_models_numbers(reference_server: str, chat_ids,
                                                                     forward_logprobs, hf_tokenizer) -> None:
    resp = chat(reference_server, messages=MESSAGES, temperature=0, max_tokens=30)
    prompt, choice = resp["prompt_token_ids"], resp["choices"][0]
    assert prompt == chat_ids(MESSAGES)  # rendered by the model's own template
    ids, _ = triples(generate(reference_server, prompt, temperature=0, max_new_tokens=30))
    assert choice["token_ids"] == ids  # greedy: the same tokens as the token API
    lps = [e["logprob"] for e in choice["logprobs"]["content"]]
    assert lps == pytest.approx(forward_logprobs(prompt, ids), abs=1e-5)
    assert choice["message"]["content"] == hf_tokenizer.decode(ids, skip_special_tokens=True)
    assert choice["message"]["tool_calls"] == [] and choice["finish_reason"] in ("stop", "length")
    assert resp["usage"] == {"prompt_tokens": len(prompt), "completion_tokens": len(ids),
                             "total_tokens": len(prompt) + len(ids)}


def test_a_scripted_reply_comes_back_parsed_and_streams_the_same_ids(start_reference_server, policies_dir: Path,
                                                                     chat_ids, hf_tokenizer) -> None:
    base = start_reference_server(policies_dir / "tool-call.yaml")
    resp = chat(base, messages=MESSAGES, tools=TOOLS, max_tokens=200)
    choice = resp["choices"][0]
    assert resp["prompt_token_ids"] == chat_ids(MESSAGES, TOOLS)
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"] == {
        "role": "assistant", "content": None, "reasoning_content": "I will write the file with the shell tool.",
        "tool_calls": [{"id": "call_0", "type": "function", "function": {
            "name": "Bash", "arguments": json.dumps({"command": "echo polar > polar.txt"})}}]}
    assert "<tool_call>" in hf_tokenizer.decode(choice["token_ids"])  # the model's own tokens of that reply
    got = events(base, "/v1/chat/completions", {"messages": MESSAGES, "tools": TOOLS, "max_tokens": 200,
                                                "stream": True, "return_token_ids": True, "logprobs": True})
    assert got[0]["prompt_token_ids"] == resp["prompt_token_ids"] and all("prompt_token_ids" not in g
                                                                          for g in got[1:])
    assert sum((g["choices"][0]["token_ids"] for g in got), []) == choice["token_ids"]
    last = got[-1]["choices"][0]
    assert last["finish_reason"] == "tool_calls" and last["delta"]["tool_calls"] == choice["message"]["tool_calls"]
    # The reply given back as the harness sends it (arguments as JSON text) renders as the template renders it.
    history = MESSAGES + [{"role": "assistant", "content": None, "tool_calls": choice["message"]["tool_calls"]},
                          {"role": "tool", "tool_call_id": "call_0", "content": ""}]
    again = chat(base, messages=history, tools=TOOLS, max_tokens=50)
    as_objects = [*MESSAGES, {"role": "assistant", "content": None, "tool_calls": [
        {"function": {"name": "Bash", "arguments": {"command": "echo polar > polar.txt"}}}]},
                  {"role": "tool", "content": ""}]
    assert again["prompt_token_ids"] == chat_ids(as_objects, TOOLS)
    assert again["choices"][0]["message"]["content"] == "Done."


@pytest.mark.parametrize("body, fragment", [
    ({"messages": []}, "`messages` must be a non-empty list"),
    ({"messages": MESSAGES, "tool_choice": "required"}, "this server takes auto or none"),
    ({"messages": MESSAGES, "n": 2}, "n"),
    ({"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "x", "arguments": "{"}}]}]},
     "arguments are not JSON"),
])
def test_a_bad_chat_request_is_a_400(reference_server: str, body: dict, fragment: str) -> None:
    r = post(reference_server, "/v1/chat/completions", body)
    assert r.status_code == 400 and fragment in r.json()["error"]["message"], r.text
