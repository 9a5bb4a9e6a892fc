"""Scripted policies: parsing (errors name the bad key), matching against prompts rendered by the real chat
template, and replies that render exactly as the template renders the same assistant turn."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from polar_serve.policy import load_policy, parse_policy
from polar_serve.prompt_view import parse_prompt

SHELLS = ["exec_command", "Bash", "bash", "run_shell_command", "shell"]


def tool(name: str) -> dict:
    return {"type": "function", "function": {"name": name, "description": "run", "parameters": {
        "type": "object", "properties": {"command": {"type": "string"}}}}}


@pytest.fixture(scope="module")
def render(hf_tokenizer):
    def run(messages: list[dict], tools: list[dict] | None = None, gen: bool = True) -> str:
        return hf_tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=gen)

    return run


def first_turn(render, tool_name: str | None) -> str:
    tools = [tool("read_file"), tool(tool_name)] if tool_name else None
    return render([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "make polar.txt"}], tools)


def after_result(render, tool_name: str) -> str:
    call = {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": tool_name, "arguments": {}}}]}
    return render([{"role": "user", "content": "make polar.txt"}, call, {"role": "tool", "content": "ok"}],
                  [tool(tool_name)])


def reply_of(policy, view, seed: int | None = None) -> tuple[str, str] | None:
    """(rule name, reply text) of the rule that matches, or None."""
    scripted = policy.reply_for(view, seed)
    return None if scripted is None else (scripted.name, scripted.text)

def test_prompt_view_reads_turns_tools_and_results(render) -> None:
    view = parse_prompt(after_result(render, "Bash"))
    assert view.tools == ("Bash",) and view.tool_results == 1 and view.after_tool_result
    assert view.last_user == "make polar.txt" and view.assistant_turns == 1
    per_line = "<|im_start|>system\n<tools>\n" + json.dumps(tool("a")) + "\n{\"name\": \"b\"}\n</tools><|im_end|>\n"
    assert parse_prompt(per_line).tools == ("a", "b")  # Qwen2.5 writes one JSON object per line
    assert parse_prompt("no chatml here").turns == ()


def test_prompt_view_reads_gemma3_turns_as_polars_template_writes_them(hf_tokenizer) -> None:
    from polar_mitm.tokens.family import OWN_TEMPLATES

    def gemma(messages: list[dict], tools: list[dict] | None = None) -> str:
        return hf_tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True,
                                                chat_template=OWN_TEMPLATES["Gemma 3"].read_text())

    ask = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "make polar.txt"}]
    first = parse_prompt(gemma(ask, [tool("read_file"), tool("Bash")]))
    assert first.tools == ("read_file", "Bash") and first.tool_results == 0 and not first.after_tool_result
    call = {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "Bash", "arguments": {}}}]}
    later = parse_prompt(gemma(ask + [call, {"role": "tool", "content": "ok"}, {"role": "tool", "content": "ok"}],
                               [tool("Bash")]))
    assert later.tools == ("Bash",) and later.tool_results == 2 and later.after_tool_result
    assert later.assistant_turns == 1 and later.last_user.endswith("make polar.txt")
    assert parse_prompt(gemma(ask)).tools == ()  # no tools: no lines of them


def test_prompt_view_reads_harmony_messages_as_polars_template_writes_them(hf_tokenizer) -> None:
    from polar_mitm.tokens.family import TEMPLATES

    def harmony(messages: list[dict], tools: list[dict] | None = None) -> str:
        return hf_tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True,
                                                chat_template=(TEMPLATES / "harmony.jinja").read_text())

    ask = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "make polar.txt"}]
    first = parse_prompt(harmony(ask, [tool("read_file"), tool("Bash")]))
    assert first.tools == ("read_file", "Bash") and first.tool_results == 0 and not first.after_tool_result
    assert first.system.startswith("# Instructions\n\nBe brief.")  # the developer message, not harmony's own
    call = {"role": "assistant", "content": "", "reasoning_content": "go",
            "tool_calls": [{"id": "c1", "function": {"name": "Bash", "arguments": {}}}]}
    results = [{"role": "tool", "tool_call_id": "c1", "content": "ok"},
               {"role": "tool", "name": "Bash", "content": "ok"}]
    later = parse_prompt(harmony(ask + [call] + results, [tool("Bash")]))
    assert later.tools == ("Bash",) and later.tool_results == 2 and later.after_tool_result
    assert later.last_user == "make polar.txt"
    # a ChatML prompt holding harmony markup a model wrote as text is still read as ChatML
    assert parse_prompt("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<|start|>x<|message|>y<|end|>"
                        "<|im_end|>\n").turns[0].role == "user"


def test_prompt_view_reads_llama3_turns_as_polars_template_writes_them(hf_tokenizer) -> None:
    from polar_mitm.tokens.family import TEMPLATES

    def llama(messages: list[dict], tools: list[dict] | None = None) -> str:
        text = hf_tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True,
                                                chat_template=(TEMPLATES / "llama3_tools.jinja").read_text())
        return "<|begin_of_text|>" + text  # (tiny-qwen2 has no BOS to write)

    ask = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "make polar.txt"}]
    first = parse_prompt(llama(ask, [tool("read_file"), tool("Bash")]))
    assert first.tools == ("read_file", "Bash") and first.tool_results == 0 and not first.after_tool_result
    assert first.system == "Be brief." and first.first_user == "make polar.txt"  # the tools' turn is the template's
    call = {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "function": {"name": "Bash",
                                                                                         "arguments": {}}}]}
    results = [{"role": "tool", "tool_call_id": "c1", "content": "ok"}, {"role": "tool", "content": "ok"}]
    later = parse_prompt(llama(ask + [call] + results, [tool("Bash")]))
    assert later.tools == ("Bash",) and later.tool_results == 2 and later.after_tool_result
    assert later.assistant_turns == 1 and later.last_user == "make polar.txt"
    assert parse_prompt(llama(ask)).tools == () and parse_prompt(llama(ask)).system == "Be brief."


def test_prompt_view_reads_mistrals_instruct_format() -> None:
    tools = "[AVAILABLE_TOOLS]" + json.dumps([tool("read_file"), tool("bash")]) + "[/AVAILABLE_TOOLS]"
    call = '[TOOL_CALLS][{"name": "bash", "arguments": {}, "id": "abcdefghi"}]</s>'
    result = '[TOOL_RESULTS]{"content": "ok", "call_id": "abcdefghi"}[/TOOL_RESULTS]'
    first = parse_prompt(f"<s>[INST]hi[/INST]Hello.</s>{tools}[INST]Be brief.\n\nmake polar.txt[/INST]")
    assert first.tools == ("read_file", "bash") and first.tool_results == 0 and not first.after_tool_result
    assert [t.role for t in first.turns] == ["user", "assistant", "user"] and first.assistant_turns == 1
    later = parse_prompt(f"<s>{tools}[INST]Be brief.\n\nmake polar.txt[/INST]{call}{result}")
    assert later.tools == ("read_file", "bash") and later.tool_results == 1 and later.after_tool_result
    assert later.last_user == "Be brief.\n\nmake polar.txt" and later.assistant_turns == 1
    answered = parse_prompt(f"<s>{tools}[INST]go[/INST]{call}{result}Done.</s>[INST]again[/INST]")
    assert [t.role for t in answered.turns] == ["user", "assistant", "tool", "assistant", "user"]


@pytest.mark.parametrize("name", SHELLS)
def test_shipped_tool_call_policy_calls_whichever_shell_is_offered(render, policies_dir: Path, name: str) -> None:
    policy = load_policy(policies_dir / "tool-call.yaml")
    rule, reply = reply_of(policy, parse_prompt(first_turn(render, name)))
    key = "cmd" if name == "exec_command" else "command"
    assert rule == "write-file"
    assert reply == ("<think>\nI will write the file with the shell tool.\n</think>\n\n<tool_call>\n"
                     f'{{"name": "{name}", "arguments": {{"{key}": "echo polar > polar.txt"}}}}\n</tool_call>')
    assert reply_of(policy, parse_prompt(after_result(render, name))) == (
        "done-after-tool-result", "<think>\nThe file is written.\n</think>\n\nDone.")
    assert reply_of(policy, parse_prompt(first_turn(render, None)))[0] == "no-shell"
    assert reply_of(policy, parse_prompt(first_turn(render, "python"))) is None  # tools, but no shell: sample


def test_structured_reply_renders_like_the_chat_template(render) -> None:
    policy = parse_policy({"rules": [{"think": "plan", "content": "Running two.", "tool_calls": [
        {"name": "Bash", "arguments": {"command": "ls", "n": [1, 2], "é": None}},
        {"name": "Bash", "arguments": '{"command": "pwd"}'}]}]})
    prompt = first_turn(render, "Bash")
    _, reply = reply_of(policy, parse_prompt(prompt))
    message = {"role": "assistant", "content": "Running two.", "reasoning_content": "plan", "tool_calls": [
        {"function": {"name": "Bash", "arguments": {"command": "ls", "n": [1, 2], "é": None}}},
        {"function": {"name": "Bash", "arguments": '{"command": "pwd"}'}}]}
    full = render([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "make polar.txt"},
                   message], [tool("read_file"), tool("Bash")], gen=False)
    assert full == prompt + reply + "<|im_end|>\n"


def test_templates_and_conditions(render) -> None:
    policy = parse_policy({"rules": [
        {"name": "regex", "when": {"last_user_regex": r"^make \w+\.txt$", "tool_results": {"max": 0},
                                   "assistant_turns": 0, "prompt_contains": ["Be brief"]},
         "reply": 'Using {tool:sh|Bash}: {"cmd": "{last_user}"}'},
        {"name": "fallback", "when": {"not": {"any_tools": True}}, "reply": "plain {last_user}"},
    ]})
    assert reply_of(policy, parse_prompt(first_turn(render, "Bash"))) == (
        "regex", 'Using Bash: {"cmd": "make polar.txt"}')
    # {tool:...} names no offered tool: the rule is skipped, the next one does not match either -> sample
    assert reply_of(policy, parse_prompt(first_turn(render, "shell"))) is None
    assert reply_of(policy, parse_prompt(first_turn(render, None))) == ("fallback", "plain make polar.txt")


def test_first_user_tells_a_sub_agent_from_its_parent(render, policies_dir: Path) -> None:
    """task-subagent.yaml: a sub-agent's conversation opens with its parent's task prompt, so the parent,
    whose later prompts quote that prompt in its tool call, is not mistaken for the sub-agent."""
    policy = load_policy(policies_dir / "task-subagent.yaml")
    prompt = "LINEAGE-SUBTASK: write sub.txt with the shell, two lines, then report."
    tools = [tool("Bash"), tool("Agent")]
    spawn = {"role": "assistant", "content": "", "tool_calls": [
        {"function": {"name": "Agent", "arguments": {"prompt": prompt}}}]}
    parent = [{"role": "user", "content": "Delegate writing sub.txt."}, spawn, {"role": "tool", "content": "done"}]
    sub = [{"role": "user", "content": f"<system-reminder>x</system-reminder>\n{prompt}"}]
    assert parse_prompt(render(sub, tools)).first_user.endswith(prompt)
    assert reply_of(policy, parse_prompt(render(sub, tools)))[0] == "sub-write"
    assert reply_of(policy, parse_prompt(render(parent[:1], tools)))[0] == "spawn"
    assert reply_of(policy, parse_prompt(render(parent, tools)))[0] == "main-done"


@pytest.mark.parametrize("data, message", [
    ({"rules": [{"reply": "x", "wen": {}}]}, "unknown key(s) ['wen']"),
    ({"rules": [{"when": {"tool_ofered": "x"}, "reply": "x"}]}, "unknown condition(s) ['tool_ofered']"),
    ({"rules": [{"reply": "x", "content": "y"}]}, "either `reply` or"),
    ({"rules": [{"when": {"last_user_regex": "("}, "reply": "x"}]}, "rules[0].when.last_user_regex"),
    ({"rules": [{"when": {"tool_results": {"least": 1}}, "reply": "x"}]}, "rules[0].when.tool_results"),
    ({"rules": [{"tool_calls": [{"name": "a", "arguments": [1]}]}]}, "must be a mapping or a JSON string"),
    ({"rules": "nope"}, "one key, `rules`"),
])
def test_bad_policies_name_the_problem(data: dict, message: str) -> None:
    with pytest.raises(ValueError) as err:
        parse_policy(data)
    assert message in str(err.value)


def test_shipped_policies_load(policies_dir: Path) -> None:
    for path in sorted(policies_dir.glob("*.yaml")):
        assert load_policy(path).rules, path
    echo = load_policy(policies_dir / "echo.yaml")
    assert reply_of(echo, parse_prompt("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")) == (
        "echo", "You said: hi")


CHOOSE = {"rules": [{"name": "pick", "choose": [
    {"name": "fix", "weight": 0.5, "content": "fixed"},
    {"name": "skip", "weight": 0.5, "reply": "skipped"},
]}]}


def session_prompt(render, workspace: str, turns: int = 0) -> str:
    """A harness-like prompt: the workspace path in the system turn, `turns` earlier exchanges after it."""
    messages = [{"role": "system", "content": f"Working directory: {workspace}"}, {"role": "user", "content": "fix"}]
    for i in range(turns):
        messages += [{"role": "assistant", "content": f"step {i}"}, {"role": "user", "content": "go on"}]
    return render(messages)


def test_choose_differs_between_sessions_and_stays_within_one(render) -> None:
    policy = parse_policy(CHOOSE)
    picks = {}
    for i in range(40):
        view = parse_prompt(session_prompt(render, f"/runs/sample-{i}/workspace"))
        picks[i] = reply_of(policy, view)
        later = parse_prompt(session_prompt(render, f"/runs/sample-{i}/workspace", turns=2))
        assert reply_of(policy, later) == picks[i]  # the session keeps its choice from call to call
    assert set(picks.values()) == {("pick/fix", "fixed"), ("pick/skip", "skipped")}
    assert 8 <= sum(p[0] == "pick/fix" for p in picks.values()) <= 32


def test_choose_follows_the_request_seed(render) -> None:
    policy = parse_policy(CHOOSE)
    views = [parse_prompt(session_prompt(render, f"/w{i}")) for i in range(10)]
    for seed in range(10):
        assert len({reply_of(policy, v, seed) for v in views}) == 1  # the seed alone decides
    assert len({reply_of(policy, views[0], seed) for seed in range(30)}) == 2


def test_choose_weights_count() -> None:
    policy = parse_policy({"rules": [{"choose": [{"weight": 9, "reply": "a"}, {"weight": 1, "reply": "b"}]}]})
    view = parse_prompt("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    got = [reply_of(policy, view, seed)[1] for seed in range(400)]
    assert 320 <= got.count("a") <= 390


@pytest.mark.parametrize("data,message", [
    ({"rules": [{"choose": []}]}, "rules[0].choose: expected a non-empty list"),
    ({"rules": [{"choose": [{"weight": 0, "reply": "a"}]}]}, "rules[0].choose[0].weight"),
    ({"rules": [{"choose": [{"weight": 1}]}]}, "rules[0].choose[0]: give either `reply`"),
    ({"rules": [{"choose": [{"weight": 1, "reply": "a", "when": {}}]}]}, "rules[0].choose[0]: unknown key"),
    ({"rules": [{"reply": "a", "choose": [{"weight": 1, "reply": "b"}]}]}, "either `choose` or a reply"),
])
def test_bad_choose_names_the_problem(data: dict, message: str) -> None:
    with pytest.raises(ValueError) as err:
        parse_policy(data)
    assert message in str(err.value)


def test_chosen_reply_is_teacher_forced_with_exact_logprobs(start_reference_server, tmp_path: Path, chat_ids,
                                                           hf_tokenizer, forward_logprobs) -> None:
    import httpx
    import yaml

    policy = tmp_path / "choose.yaml"
    policy.write_text(yaml.safe_dump(CHOOSE))
    base = start_reference_server(policy)
    prompt = chat_ids([{"role": "user", "content": "fix it"}])
    seen = set()
    for seed in range(6):
        body = {"input_ids": prompt, "return_logprob": True,
                "sampling_params": {"max_new_tokens": 50, "temperature": 1.0, "seed": seed}}
        resp = httpx.post(f"{base}/generate", json=body, timeout=120).json()
        rule, ids = resp["meta_info"]["policy_rule"], resp["output_ids"]
        expected = "fixed" if rule == "pick/fix" else "skipped"
        assert hf_tokenizer.decode(ids) == expected + "<|im_end|>"
        lps = [lp for lp, _t, _x in resp["meta_info"]["output_token_logprobs"]]
        assert lps == pytest.approx(forward_logprobs(prompt, ids), abs=1e-5)
        seen.add(rule)
    assert seen == {"pick/fix", "pick/skip"}
