"""History substitution with the fixture model's real tokenizer and chat template."""

import pytest
from transformers import AutoTokenizer

from polar_mitm.conversation import Conversation, Message, Tool, ToolCall
from polar_mitm.sessions.cache import SessionCache
from polar_mitm.tokens.prompt import (HISTORY_BYTES_PER_ID, CallTokens, ChatRenderer, SessionHistory,
                                     template_difference, to_template_messages, to_template_tools)

SHELL = Tool("shell", "Run a command", {"type": "object", "properties": {"command": {"type": "string"}}})


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return AutoTokenizer.from_pretrained(str(tiny_model_dir))


@pytest.fixture()
def renderer(tokenizer):
    return ChatRenderer(tokenizer)


def conv(*messages, tools=(SHELL,)):
    return Conversation("openai_chat", "m", tuple(messages), tools)


def full_ids(tokenizer, c: Conversation) -> list[int]:
    text = tokenizer.apply_chat_template(to_template_messages(c.messages), tools=to_template_tools(c.tools),
                                         add_generation_prompt=True, tokenize=False)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def sample(history, prompt, tokenizer, reply: Message, reply_text: str, call_id: str, eos=True):
    """Stand-in for the engine: the reply's tokens as if sampled, then remembered like the proxy does."""
    out = tokenizer(reply_text, add_special_tokens=False)["input_ids"] + ([tokenizer.eos_token_id] if eos else [])
    history.remember(prompt, reply, CallTokens.of(call_id, prompt, out, eos))
    return out


SYSTEM = Message("system", "You are a coding agent.")
USER = Message("user", "Create hello.txt")
CALL = ToolCall("call_1", "shell", '{"command": "echo hi > hello.txt"}')
REPLY = Message("assistant", "", "I will write it.", (CALL,))
REPLY_TEXT = '<think>\nI will write it.\n</think>\n\n<tool_call>\n{"name": "shell", "arguments": {"command": "echo hi > hello.txt"}}\n</tool_call>'
RESULT = Message("tool", "done", tool_call_id="call_1", name="shell")


def test_first_call_renders_the_chat_template(renderer, tokenizer):
    c = conv(SYSTEM, USER)
    prompt = SessionHistory().build_prompt(c, renderer)
    assert prompt.source == "rendered:first_call" and prompt.parent_call_id is None
    assert prompt.ids == full_ids(tokenizer, c)


def test_second_call_extends_the_first_calls_tokens(renderer, tokenizer):
    history = SessionHistory()
    p1 = history.build_prompt(conv(SYSTEM, USER), renderer)
    out1 = sample(history, p1, tokenizer, REPLY, REPLY_TEXT, "c1")
    c2 = conv(SYSTEM, USER, REPLY, RESULT)
    p2 = history.build_prompt(c2, renderer)
    assert p2.source == "substituted" and p2.parent_call_id == "c1"
    assert list(p2.ids[: len(p1.ids) + len(out1)]) == p1.ids + out1
    assert p2.ids.typecode == "i"  # copied from the history's int32 arrays, not made into Python ints
    # The sampled reply matched the template's own rendering, so the text is the full rendering.
    assert tokenizer.decode(p2.ids) == tokenizer.decode(full_ids(tokenizer, c2))


def test_replayed_turn_matches_by_meaning(renderer, tokenizer):
    history = SessionHistory()
    p1 = history.build_prompt(conv(SYSTEM, USER), renderer)
    out1 = sample(history, p1, tokenizer, REPLY, REPLY_TEXT, "c1")
    # The harness re-encoded the arguments, renamed the call id and dropped the reasoning.
    replayed = Message("assistant", "", None, (ToolCall("toolu_X", "shell", '{ "command":"echo hi > hello.txt" }'),))
    p2 = history.build_prompt(conv(SYSTEM, USER, replayed, RESULT), renderer)
    assert p2.source == "substituted" and list(p2.ids[: len(p1.ids) + len(out1)]) == p1.ids + out1


def test_edited_history_is_rendered_in_full(renderer, tokenizer):
    history = SessionHistory()
    p1 = history.build_prompt(conv(SYSTEM, USER), renderer)
    sample(history, p1, tokenizer, REPLY, REPLY_TEXT, "c1")
    edited = Message("assistant", "", None, (ToolCall("call_1", "shell", '{"command": "rm -rf /"}'),))
    c2 = conv(SYSTEM, USER, edited, RESULT)
    p2 = history.build_prompt(c2, renderer)
    assert p2.source == "rendered:no_matching_call" and p2.ids == full_ids(tokenizer, c2)
    # a changed tool list is another conversation too
    assert history.build_prompt(conv(SYSTEM, USER, REPLY, RESULT, tools=()), renderer).source.startswith("rendered")


def test_truncated_reply_is_closed_before_the_new_turn(renderer, tokenizer):
    history = SessionHistory()
    p1 = history.build_prompt(conv(SYSTEM, USER), renderer)
    cut = Message("assistant", "Let me th")
    out1 = sample(history, p1, tokenizer, cut, "Let me th", "c1", eos=False)
    p2 = history.build_prompt(conv(SYSTEM, USER, cut, Message("user", "go on")), renderer)
    assert p2.source == "substituted"
    delta = p2.ids[len(p1.ids) + len(out1):]
    assert delta[0] == tokenizer.eos_token_id
    assert tokenizer.decode(p2.ids).endswith("<|im_end|>\n<|im_start|>user\ngo on<|im_end|>\n<|im_start|>assistant\n")


def test_longest_chain_wins_over_an_earlier_call(renderer, tokenizer):
    history = SessionHistory()
    p1 = history.build_prompt(conv(SYSTEM, USER), renderer)
    sample(history, p1, tokenizer, REPLY, REPLY_TEXT, "c1")
    p2 = history.build_prompt(conv(SYSTEM, USER, REPLY, RESULT), renderer)
    reply2 = Message("assistant", "Done.")
    sample(history, p2, tokenizer, reply2, "Done.", "c2")
    p3 = history.build_prompt(conv(SYSTEM, USER, REPLY, RESULT, reply2, Message("user", "thanks")), renderer)
    assert p3.parent_call_id == "c2"


def test_per_turn_rendering_does_not_grow_with_history(renderer, tokenizer, monkeypatch):
    history = SessionHistory()
    messages = [SYSTEM, USER]
    rendered_sizes = []
    original = renderer.render_text

    def counting(msgs, tools, generation_prompt):
        rendered_sizes.append(len(msgs))
        return original(msgs, tools, generation_prompt)

    monkeypatch.setattr(renderer, "render_text", counting)
    for turn in range(12):
        prompt = history.build_prompt(conv(*messages), renderer)
        reply = Message("assistant", f"step {turn}")
        sample(history, prompt, tokenizer, reply, f"step {turn}", f"c{turn}")
        messages += [reply, Message("user", f"next {turn}")]
        assert turn == 0 or prompt.source == "substituted"
    assert max(rendered_sizes[2:]) <= 3  # base (2 messages) + the one new message, whatever the history length


@pytest.mark.parametrize("used, rendered, differ", [
    ([1, 2, 3], [1, 2, 3], 0),
    ([1, 2, 3, 4], [1, 2, 3], 1),  # one more at the end
    ([1, 9, 9, 9, 2, 3], [1, 2, 3], 3),  # three inserted in the middle
    ([1, 2, 2, 3], [1, 2, 3], 1),  # prefix and suffix overlap: still one
    ([5, 6], [7, 8, 9], 3),
    ([], [1], 1),
])
def test_template_difference_counts_the_tokens_between_common_ends(used, rendered, differ):
    assert template_difference(used, rendered) == differ
    assert template_difference(rendered, used) == differ


def second_call(renderer, tokenizer, reply_text: str, resent: Message, *later: Message):
    """A session's second call: the first reply sampled as `reply_text`, re-sent by the harness as `resent`
    (a harness may drop its reasoning), then `later` messages. Its prompt and the template's own rendering."""
    history = SessionHistory()
    first = conv(USER)
    p1 = history.build_prompt(first, renderer)
    sample(history, p1, tokenizer, REPLY, reply_text, "c1")
    c2 = conv(USER, resent, *later)
    return history.build_prompt(c2, renderer), renderer.render_full(c2)


def test_an_append_only_template_renders_what_was_substituted(renderer, tokenizer):
    prompt, rendered = second_call(renderer, tokenizer, REPLY_TEXT, REPLY, RESULT)
    assert prompt.source == "substituted" and template_difference(prompt.ids, rendered) == 0


def test_reasoning_a_harness_does_not_resend_is_kept_and_counted(renderer, tokenizer):
    no_reasoning = Message("assistant", "", None, (CALL,))
    prompt, rendered = second_call(renderer, tokenizer, REPLY_TEXT, no_reasoning, RESULT)
    kept = tokenizer("<think>\nI will write it.\n</think>\n\n", add_special_tokens=False)["input_ids"]
    assert prompt.source == "substituted" and template_difference(prompt.ids, rendered) == len(kept)


def test_qwen3s_real_template_on_a_tool_turn_and_on_a_new_user_message():
    """Qwen3's template renders reasoning only after the last user message: after a tool result it renders the
    sampled turn as it was (no difference); once the user speaks again it would render that turn without its
    reasoning. The prompt keeps what was sampled (one chain) and the difference is those reasoning tokens."""
    from tests.polar_mitm.tokens.test_reply_families import real_tokenizer

    qwen3 = real_tokenizer("qwen3")
    renderer = ChatRenderer(qwen3)
    prompt, rendered = second_call(renderer, qwen3, REPLY_TEXT, REPLY, RESULT)
    assert prompt.source == "substituted" and template_difference(prompt.ids, rendered) == 0
    prompt, rendered = second_call(renderer, qwen3, REPLY_TEXT, REPLY, RESULT, Message("assistant", "Done."),
                                   Message("user", "Now delete it."))
    think = qwen3.encode("<think>\nI will write it.\n</think>\n\n", add_special_tokens=False)
    assert prompt.source == "substituted" and template_difference(prompt.ids, rendered) == len(think)
    assert len(prompt.ids) - len(rendered) == len(think)


def session_turns(n: int) -> list[tuple[Conversation, Message, str]]:
    """Session n's three calls: (request, reply, reply text), each request replaying the earlier turns."""
    user = Message("user", f"Task {n}: create file{n}.txt with {n * 7919} in it " + "and check it " * (n % 5))
    out, messages = [], [SYSTEM, user]
    for turn in range(3):
        call = ToolCall(f"call_{turn}", "shell", f'{{"command": "echo {n * turn} >> file{n}.txt"}}')
        reply = Message("assistant", "", f"Step {turn} of task {n}.", (call,))
        text = (f"<think>\nStep {turn} of task {n}.\n</think>\n\n<tool_call>\n{{\"name\": \"shell\", "
                f"\"arguments\": {{\"command\": \"echo {n * turn} >> file{n}.txt\"}}}}\n</tool_call>")
        out.append((conv(*messages), reply, text))
        messages += [reply, Message("tool", f"ok {turn}", tool_call_id=f"call_{turn}", name="shell")]
    return out


def test_history_memory_is_counted_within_its_bound_and_evicted_past_the_budget(tokenizer):
    """Three hundred sessions of three calls: what the histories really hold (tracemalloc) stays within what the
    budget counts (nbytes: HISTORY_BYTES_PER_ID an id); under a small budget the least recently used sessions go,
    the total stays under it, and an evicted session's next prompt is rendered in full, exactly."""
    import gc
    import tracemalloc

    renderer = ChatRenderer(tokenizer)
    renderer.whole, renderer.prefixes.enabled = None, False  # no prompt caches: only the histories are measured
    histories = SessionCache(SessionHistory, weigh=SessionHistory.nbytes)
    sessions = [session_turns(n) for n in range(300)]
    renderer.render_full(sessions[0][0][0])  # the template compiled before counting: once a process, not a session
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for n, turns in enumerate(sessions):
        for turn, (c, reply, text) in enumerate(turns):
            history = histories.get(("t", str(n)))
            prompt = history.build_prompt(c, renderer)
            assert prompt.source == ("rendered:first_call" if turn == 0 else "substituted")
            sample(history, prompt, tokenizer, reply, text, f"s{n}c{turn}")
            histories.reweigh(("t", str(n)))
        del prompt
    gc.collect()
    held = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    ids = sum(h.ids_held for h in histories.values())
    print(f"{len(histories)} histories, {ids} ids: {held / ids:.1f} bytes an id held, counted "
          f"{histories.weight / ids:.1f} ({HISTORY_BYTES_PER_ID} an id plus each call's and session's own)")
    assert HISTORY_BYTES_PER_ID == 4  # ids held as 4-byte ints: 36 as a tuple of Python ints
    assert ids > 300 * 3 * 50 and held <= histories.weight == sum(h.nbytes() for h in histories.values())

    budget = histories.weight // 10  # about 30 sessions' worth
    small = SessionCache(SessionHistory, weigh=SessionHistory.nbytes, max_weight=budget)
    for n, turns in enumerate(sessions[:100]):
        for turn, (c, reply, text) in enumerate(turns):
            history = small.get(("t", str(n)))
            sample(history, history.build_prompt(c, renderer), tokenizer, reply, text, f"s{n}c{turn}")
            small.reweigh(("t", str(n)))
            assert small.weight <= budget
    assert small.evictions >= 60 and small.peek(("t", "0")) is None
    c, *_ = sessions[0][2]  # session 0's third call again, its history gone
    again = small.get(("t", "0")).build_prompt(c, renderer)
    assert again.source == "rendered:evicted" and again.ids == full_ids(tokenizer, c)
