"""Prompt token ids for a Conversation: the model's chat template, plus history substitution.

Harnesses re-send the whole history every turn. When a request replays an earlier call of the same
session (its messages, then the reply that call sampled), the prompt is that call's
`prompt_ids + output_ids` followed by the rendering of only the new messages, so the token stream
stays append-only and holds exactly what the model sampled (docs/design.md §1, issue 3 item 5).

Some real templates render history otherwise than the turns were sampled (Qwen3 drops the reasoning of turns
before the last user message; others reorder system parts or add today's date): such a substituted prompt is
exact for training but not what the template alone would show the model at inference. `template_difference`
measures it, and the proxy records it on sampled calls (polar_mitm/calls/dispatch.py, `history_check`).
"""
from __future__ import annotations

import hashlib
import json
from array import array
from dataclasses import dataclass, field
from typing import Any, Sequence

import orjson
from jinja2 import TemplateError

from polar_mitm.conversation import Conversation, Message, ProviderError, Tool
from polar_mitm.tokens.prefix_cache import PrefixCache, RenderCache, split_tokens

# A fixed stand-in history: the delta of new messages is rendered after it and cut off, so the per-turn template
# work does not grow with the real history. The delta is what the template writes after the stand-in reply's
# end-of-turn token; the stand-in's own turn may render otherwise once messages follow it (Qwen3 drops the
# reasoning of turns before the last user message): the substituted prompt keeps what was sampled there, and the
# history check counts the difference.
_USER, _REPLY = "polar-base", "polar-base-reply"
_BASE = (Message("user", _USER), Message("assistant", _REPLY, "polar-base-reasoning"))


def to_template_messages(messages: tuple[Message, ...], text_arguments: bool = False) -> list[dict[str, Any]]:
    """Neutral messages in the shape HF chat templates expect (tool-call arguments as objects), or with
    `text_arguments` as the OpenAI chat API takes them (arguments as JSON text)."""
    out: list[dict[str, Any]] = []
    for m in messages:
        d: dict[str, Any] = {"role": m.role, "content": m.content}
        if m.reasoning:
            d["reasoning_content"] = m.reasoning
        if m.tool_calls:
            d["tool_calls"] = [
                {"id": c.id, "type": "function", "function": {
                    "name": c.name, "arguments": (c.arguments or "{}") if text_arguments else c.args()}}
                for c in m.tool_calls
            ]
        if m.role == "tool":
            d["tool_call_id"] = m.tool_call_id
            if m.name:
                d["name"] = m.name
        out.append(d)
    return out


def to_template_tools(tools: tuple[Tool, ...]) -> list[dict[str, Any]] | None:
    if not tools:
        return None
    return [
        {"type": "function", "function": {"name": t.name, "description": t.description, "parameters": t.parameters}}
        for t in tools
    ]


def message_key(m: Message) -> bytes:
    """What a replayed message must keep to count as the same turn: harnesses re-encode tool-call JSON,
    reassign ids, move cache markers and keep or drop reasoning, none of which changes its meaning."""
    calls = [[c.name, c.args()] for c in m.tool_calls]
    return _key_json([m.role, m.content.strip(), calls, m.name])


def _key_json(value: Any) -> bytes:
    """Sorted-key JSON, only ever compared with itself (orjson: the stdlib's json.dumps costs ~10x on the
    long histories every later call re-hashes)."""
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
    except TypeError:  # lone surrogates, ints past 64 bits, non-str keys: the stdlib, escaped (still one-to-one)
        return json.dumps(value, sort_keys=True, ensure_ascii=True).encode("ascii")


def _chain(prev: bytes, item: bytes) -> bytes:
    return hashlib.blake2b(prev + item, digest_size=16).digest()


def conversation_hashes(conv: Conversation) -> list[bytes]:
    """h[k] identifies (tools, messages[:k]); h[0] covers tools only."""
    hashes = [_chain(b"", _key_json([[t.name, t.description, t.parameters] for t in conv.tools]))]
    for m in conv.messages:
        hashes.append(_chain(hashes[-1], message_key(m)))
    return hashes


@dataclass(frozen=True)
class CallTokens:
    """What the history needs to remember of one finished call. Its prompt is kept as the ids it added after
    its parent's `prompt_ids + output_ids` (a substituted prompt starts with exactly those), so a session's
    history holds each id once, as 4-byte ints (array 'i': a tuple of Python ints took ~36 bytes an id, ~4 MB
    for a 110k-token session), and the next prompt is built from these pieces in one pass (~2 ms per 100k ids:
    the Python ints a prompt list needs are made then)."""

    call_id: str
    parent: "CallTokens | None"
    new_ids: array  # the prompt's ids after the parent's (all of them when there is no parent)
    output_ids: array
    ended_with_eos: bool

    def ids(self) -> array:
        """This call's prompt_ids + output_ids, as a new array('i'): copied buffer by buffer (~0.01 ms per 100k
        ids; a list of them took ~2.5 ms to make its Python ints)."""
        chain: list[CallTokens] = []
        node: CallTokens | None = self
        while node is not None:
            chain.append(node)
            node = node.parent
        out = array("i")
        for node in reversed(chain):
            out += node.new_ids
            out += node.output_ids
        return out

    @classmethod
    def of(cls, call_id: str, prompt: "Prompt", output_ids: list[int], ended_with_eos: bool) -> "CallTokens":
        new = prompt.ids[prompt.extends:] if prompt.parent is not None else prompt.ids
        return cls(call_id, prompt.parent, array("i", new), array("i", output_ids), ended_with_eos)


@dataclass(frozen=True)
class Prompt:
    ids: Sequence[int]  # rendered: a list or a cached tuple; substituted: an array('i') (CallTokens.ids)
    source: str  # "substituted" | "rendered:<why>"
    parent_call_id: str | None
    hashes: list[bytes] = field(repr=False)
    extends: int = 0  # substituted: the first this many ids are the parent's prompt_ids + output_ids
    parent: CallTokens | None = field(default=None, repr=False, compare=False)


class ChatRenderer:
    """Renders conversations with one tokenizer's chat template."""

    def __init__(self, tokenizer: Any, turn_end: str | None = None) -> None:
        self.tokenizer = tokenizer
        # a fast tokenizer's Rust backend directly: the same ids without the Python wrapper's ~0.3 ms a call
        self._backend = getattr(tokenizer, "_tokenizer", None) if getattr(tokenizer, "is_fast", False) else None
        # what the template closes a past assistant turn with: the eos token, but harmony's <|end|> (gpt-oss
        # samples <|return|> there, and <|call|> after a call, which its template writes as sampled)
        self.eos_text = turn_end if turn_end is not None else (
            tokenizer.decode([tokenizer.eos_token_id]) if tokenizer.eos_token_id is not None else "")
        self._heads: dict[bytes, str] = {}  # tools key -> the stand-in history rendered up to its user message
        self.prefixes = PrefixCache(self.encode, split_tokens(tokenizer))
        # a template that reads the clock (strftime_now: today's date) renders differently tomorrow
        self.whole = None if "strftime" in str(getattr(tokenizer, "chat_template", "")) else RenderCache()

    def _head(self, tools: tuple[Tool, ...], tools_key: bytes) -> str:
        """The stand-in history rendered with these tools, up to its user message: what comes before the turn
        a substituted prompt replaces by the sampled one (system prompt, tools, earlier turns)."""
        if tools_key not in self._heads:
            if len(self._heads) > 64:
                self._heads.clear()
            base = self.render_text(_BASE, tools, generation_prompt=False)
            self._heads[tools_key] = base[: base.find(_USER) + len(_USER)]
        return self._heads[tools_key]

    def render_text(self, messages: tuple[Message, ...], tools: tuple[Tool, ...], generation_prompt: bool) -> str:
        return self._render(to_template_messages(messages), to_template_tools(tools), generation_prompt)

    def _render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, generation_prompt: bool) -> str:
        try:
            return self.tokenizer.apply_chat_template(
                messages, tools=tools, add_generation_prompt=generation_prompt, tokenize=False)
        except TemplateError as e:  # e.g. a template that raises on a role order it does not support
            raise ProviderError(400, f"the model's chat template rejected this conversation: {e}") from e

    def encode(self, text: str) -> list[int]:
        if self._backend is not None:
            return self._backend.encode(text, add_special_tokens=False).ids
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def render_full(self, conv: Conversation, remember: bool = True) -> list[int]:
        """The whole prompt's ids: from the render cache when this exact conversation was rendered before;
        else rendered, with the part before the last message (system prompt, tools: what sessions share)
        from the shared-prefix cache when another call rendered it already. remember=False: a one-off render
        (a check) that the render cache does not keep."""
        messages, tools = to_template_messages(conv.messages), to_template_tools(conv.tools)
        key = self.whole.key(messages, tools) if self.whole is not None else None
        ids = self.whole.get(key) if key is not None else None
        if ids is not None:
            return ids
        text = self._render(messages, tools, generation_prompt=True)
        last = conv.messages[-1].content if conv.messages else ""
        shared = text.rfind(last) if isinstance(last, str) and last else -1
        ids = self.prefixes.encode(text, shared if shared >= 0 else len(text))
        if key is not None and remember:
            self.whole.put(key, ids)
        return ids

    def render_delta(
        self, new: tuple[Message, ...], tools: tuple[Tool, ...], tools_key: bytes, ended_with_eos: bool
    ) -> list[int] | None:
        """Token ids that follow a sampled assistant turn and introduce `new` plus the generation prompt: what the
        template writes after that turn's end-of-turn token. None when the template renders what came before
        the turn otherwise once `new` follows, or ends the turn with no end-of-turn token (then render in full)."""
        head = self._head(tools, tools_key)
        full = self.render_text(_BASE + new, tools, generation_prompt=True)
        reply = full.find(_REPLY, len(head))
        end = full.find(self.eos_text, reply) if self.eos_text and reply >= 0 else -1
        if not full.startswith(head) or end < 0:
            return None
        delta = full[end + len(self.eos_text):]
        if not ended_with_eos:
            delta = self.eos_text + delta  # the turn was cut short: close it as the template would
        return self.encode(delta)


def template_difference(used: Sequence[int], rendered: Sequence[int]) -> int:
    """How many tokens of two prompts differ: all but their common prefix and common suffix (0: the same)."""
    if type(used) is type(rendered) and used == rendered:  # an array never equals a list: numpy compares those
        return 0
    import numpy as np  # transformers' dependency: a compare of 100k ids in C, not a Python loop

    a, b = np.asarray(used, dtype=np.int64), np.asarray(rendered, dtype=np.int64)
    n = min(len(a), len(b))
    unequal = np.flatnonzero(a[:n] != b[:n])
    prefix = int(unequal[0]) if len(unequal) else n
    tail = n - prefix
    unequal = np.flatnonzero(a[len(a) - tail:][::-1] != b[len(b) - tail:][::-1]) if tail else unequal[:0]
    suffix = int(unequal[0]) if len(unequal) else tail
    return max(len(a), len(b)) - prefix - suffix


HISTORY_BYTES_PER_ID = 4  # an id in a CallTokens array('i')
HISTORY_BYTES_PER_CALL = 600  # a CallTokens, its two arrays' headers, its key and dict slot
HISTORY_BYTES_PER_SESSION = 1024  # a SessionHistory, its dict, its place in the proxy's LRU


class SessionHistory:
    """Finished calls of one session, keyed by the hash of (tools, messages + the reply they produced)."""

    def __init__(self, evicted: bool = False) -> None:
        self._calls: dict[bytes, CallTokens] = {}
        self.ids_held = 0  # ids in the calls held (each once: a call keeps only the ids after its parent's)
        self.substituted = 0  # substituted prompts built so far (the template check samples the 1st, 2nd, 4th…)
        self.evicted = evicted  # an earlier history of this session was dropped to bound memory
        self.engine: str | None = None  # the replica the session is placed on (polar_mitm/engines/replicas.py)
        self.moved = False

    def move_to(self, url: str) -> None:
        """The session goes to another replica: its chain restarts there, from a prompt rendered in full, so
        no merged trajectory spans two replicas (which may serve different weight versions)."""
        self._calls.clear()
        self.ids_held = 0
        self.engine, self.moved = url, True

    def remember(self, prompt: Prompt, reply: Message, call: CallTokens) -> None:
        key = _chain(prompt.hashes[-1], message_key(reply))
        old = self._calls.get(key)
        if old is not None:  # the same turn sampled again (a retry): the new call replaces it
            self.ids_held -= len(old.new_ids) + len(old.output_ids)
        self._calls[key] = call
        self.ids_held += len(call.new_ids) + len(call.output_ids)

    def nbytes(self) -> int:
        """About what this history holds in memory (HISTORY_BYTES_PER_ID, measured in the tests)."""
        return (self.ids_held * HISTORY_BYTES_PER_ID + len(self._calls) * HISTORY_BYTES_PER_CALL
                + HISTORY_BYTES_PER_SESSION)

    def build_prompt(self, conv: Conversation, renderer: ChatRenderer) -> Prompt:
        hashes = conversation_hashes(conv)
        first = "engine_moved" if self.moved else "evicted" if self.evicted else "first_call"
        why = first if not self._calls else "no_matching_call"
        # Longest replayed prefix that ends with one of our replies, leaving new messages after it.
        for k in range(len(conv.messages) - 1, 0, -1):
            parent = self._calls.get(hashes[k])
            if parent is None:
                continue
            if conv.messages[k - 1].role != "assistant":
                continue
            delta = renderer.render_delta(conv.messages[k:], conv.tools, hashes[0], parent.ended_with_eos)
            if delta is None:
                why = "template_not_append_only"
                break
            ids = parent.ids()
            extends = len(ids)
            ids.extend(delta)
            self.substituted += 1
            return Prompt(ids, "substituted", parent.call_id, hashes, extends, parent)
        return Prompt(renderer.render_full(conv), f"rendered:{why}", None, hashes)
