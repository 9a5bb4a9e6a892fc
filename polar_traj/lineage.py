"""Lineage of one session's chains: which chain is the main agent, a sub-agent of which tool call, a
continuation after a context compaction, or a side call (titles, display summaries, classifiers).

Rules (docs/trajectories.md, "Lineage", tells the same story with the per-harness heuristics):
- Sub-agent: a chain whose first user message holds the `prompt` argument of a spawn tool call made
  earlier by another chain (Claude Code `Task` / `Agent`, OpenCode `task`), checked the other way too: the
  parent's later tool result for that call holds the sub-agent's final answer. Each tool call spawns at
  most one sub-agent; among candidates the one confirmed by both wins, then the latest call before it.
- Compaction: a chain whose first prompt carries the reply of an earlier call of another chain outside
  any tool result (the summary that replaced the history; large enough not to be a coincidence), or that
  prefix_merge labelled a `compaction` break, continues that chain: `compaction_continuation`, segment
  + 1. The summarising call stays in the earlier segment, trainable (a chain of its own when the harness
  summarises with another system prompt; it then takes the role and segment of the chain it summarised).
- Side call: a chain that offers no tools, in a session where some chain does, whose system prompt or
  first message says it is a title, topic or classifier call (SIDE_CALL), and is neither of the above.
  Weight 0 by default (outcomes.py). Other tool-less chains (a framework's reviewer agent) stay main.
- Forks and other breaks stay in the lineage of the chain they left; every other chain is `main`.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from .chains import Chain
from .messages import conversation_messages
from .records import CallRecord

ROLES = ("main", "subagent", "compaction_continuation", "side_call")
SPAWN_TOOLS = {"Task": "prompt", "Agent": "prompt", "task": "prompt"}  # tool name -> its prompt argument
MIN_SUMMARY_CHARS = 40  # a reply shorter than this found in a later prompt could be a coincidence
# What a tool-less side call's system prompt or first message says it is (OpenCode "You are a title
# generator", Claude Code's title and new-topic calls, Gemini CLI's next-speaker check, classifiers). A
# tool-less chain that says none of this (a framework's reviewer agent, a final-answer call) stays main.
SIDE_CALL = re.compile(r"\btitles?\b|\btopic\b|classif|next speaker|command prefix", re.IGNORECASE)
COMPACTION_MARKERS = (  # the harness's own words around a summary (Claude Code, OpenCode)
    "This session is being continued from a previous conversation",
    "What did we do so far?",
)

Payload = Callable[[str], tuple[dict[str, Any], dict[str, Any] | None]]  # call_id -> (request, response)
Reply = Callable[[str], dict[str, Any] | None]  # call_id -> response: most calls need only theirs


@dataclass(frozen=True)
class Lineage:
    role: str
    parent: int | None = None  # index of the parent chain
    spawned_by_call_id: str | None = None  # the parent's call whose tool call started this sub-agent
    tool_call_id: str | None = None
    segment: int = 0  # compaction segment of its agent (0 before the first compaction)
    evidence: tuple[str, ...] = ()  # what decided it, e.g. ("prompt", "result") or ("summary",)
    compaction_summary: bool = False  # this chain is the harness's summarising call

    def to_dict(self, trajectory_ids: Sequence[str]) -> dict[str, Any]:
        return {"role": self.role,
                "parent_trajectory_id": None if self.parent is None else trajectory_ids[self.parent],
                "spawned_by_call_id": self.spawned_by_call_id, "tool_call_id": self.tool_call_id,
                "segment": self.segment, "evidence": list(self.evidence),
                "compaction_summary": self.compaction_summary}


@dataclass(frozen=True)
class Spawn:
    call_id: str  # the call whose reply made the tool call
    tool_call_id: str
    prompt: str
    result: str | None  # the tool result the parent got back, when the chain saw it
    ended_at: float


@dataclass(frozen=True)
class ChainView:
    """What lineage reads of one chain: its first prompt's messages and its calls' replies."""

    first_user: str  # whitespace-normalised, like every text here
    history: str  # the first prompt's user and assistant messages (no system turns, no tool results)
    history_user: str  # its user messages only
    offers_tools: bool
    opening: str  # the first prompt's system text and first user message (what a side call says it is)
    answer: str  # the last call's reply text
    replies: dict[str, str]  # call_id -> reply text
    spawns: tuple[Spawn, ...]
    call_ids: tuple[str, ...]
    started_at: float
    ended_at: float


def squash(text: str) -> str:
    return " ".join(text.split())


def view_chain(chain: Chain, payload: Payload, reply: Reply) -> ChainView:
    calls = chain.calls
    request, response = _payload(calls[0], payload)
    first = conversation_messages(calls[0].api, request, None)  # the first prompt, without its reply
    last = conversation_messages(calls[-1].api, *_payload(calls[-1], payload))
    prompt = first["messages"]
    users = [squash(m.get("content") or "") for m in prompt if m["role"] == "user"]
    results = {m.get("tool_call_id"): squash(m.get("content") or "") for m in last["messages"] if m["role"] == "tool"}
    replies: dict[str, str] = {}
    spawns: list[Spawn] = []
    for call in calls:
        message = _reply(call, reply, last if call is calls[-1] else None)
        replies[call.call_id] = squash(message.get("content") or "")
        spawns.extend(_spawns(call, message, results))
    return ChainView(
        first_user=users[0] if users else "", history=_texts(prompt, ("user", "assistant")),
        history_user=" ".join(users), offers_tools=bool(first["tools"]),
        opening=f"{_texts(prompt, ('system',))} {users[0] if users else ''}",
        answer=replies[calls[-1].call_id], replies=replies, spawns=tuple(spawns),
        call_ids=tuple(c.call_id for c in calls), started_at=calls[0].started_at, ended_at=calls[-1].ended_at,
    )


def _texts(messages: list[dict[str, Any]], roles: tuple[str, ...]) -> str:
    return " ".join(squash(m.get("content") or "") for m in messages if m["role"] in roles)


def _payload(call: CallRecord, payload: Payload) -> tuple[dict[str, Any], dict[str, Any] | None]:
    return (call.request, call.response) if call.request else payload(call.call_id)


def _reply(call: CallRecord, reply: Reply, known: dict[str, Any] | None) -> dict[str, Any]:
    """The call's own reply message (an empty one when it has none)."""
    if known is None:
        known = conversation_messages(call.api, {}, call.response if call.request else reply(call.call_id))
    messages = known["messages"]
    return messages[-1] if messages and messages[-1]["role"] == "assistant" else {}


def _spawns(call: CallRecord, reply: dict[str, Any], results: dict[str, str]) -> list[Spawn]:
    spawns = []
    for tc in reply.get("tool_calls") or []:
        name = tc["function"]["name"]
        if name not in SPAWN_TOOLS:
            continue
        try:
            args = json.loads(tc["function"]["arguments"] or "{}")
        except json.JSONDecodeError:
            continue
        prompt = args.get(SPAWN_TOOLS[name]) if isinstance(args, dict) else None
        if isinstance(prompt, str) and prompt.strip():
            spawns.append(Spawn(call.call_id, tc["id"], squash(prompt), results.get(tc["id"]), call.ended_at))
    return spawns


def session_lineage(chains: Sequence[Chain], payload: Payload, reply: Reply) -> list[Lineage]:
    """One Lineage per chain, in the order given (prefix_merge's order: by first call). `payload` is asked
    only for each chain's first and last call, `reply` for the others."""
    views = [view_chain(c, payload, reply) for c in chains]
    ctx = _Context(chains, views)
    for i in sorted(range(len(chains)), key=lambda i: views[i].started_at):
        ctx.done[i] = ctx.label(i)
    return [lin or Lineage("main") for lin in ctx.done]


class _Context:
    """The chains of one session, their views and the lineages decided so far (in start order)."""

    def __init__(self, chains: Sequence[Chain], views: Sequence[ChainView]) -> None:
        self.chains, self.views = chains, views
        self.chain_of_call = {cid: i for i, v in enumerate(views) for cid in v.call_ids}
        self.agentic = any(v.offers_tools for v in views)
        self.done: list[Lineage | None] = [None] * len(chains)
        self.used: set[str] = set()  # tool_call_ids that already have their sub-agent
        self.summaries = {i: cid for i, v in enumerate(views) if (cid := self._summary_call(i)) is not None}
        # a chain of its own that only summarises (another system prompt) -> the chain it summarised
        self.summarised: dict[int, int | None] = {}
        for cid in self.summaries.values():
            s = self.chain_of_call[cid]
            if not views[s].offers_tools or len(views[s].call_ids) == 1:
                self.summarised[s] = self._summarised_by(s)

    def _summary_call(self, i: int) -> str | None:
        """The earlier call of another chain whose reply chain i's first prompt carries outside tool results:
        in a user message (Claude Code), or anywhere next to the harness's compaction words (OpenCode)."""
        v = self.views[i]
        marker = any(m in v.history for m in COMPACTION_MARKERS)
        best: tuple[int, str] | None = None
        for j, other in enumerate(self.views):
            if j == i or other.started_at >= v.started_at:
                continue
            for cid, reply in other.replies.items():
                if len(reply) < MIN_SUMMARY_CHARS or (best and len(reply) < best[0]):  # ties: the latest
                    continue
                if reply in v.history_user or (marker and reply in v.history):
                    best = (len(reply), cid)
        return None if best is None else best[1]

    def _summarised_by(self, s: int) -> int | None:
        """Of the earlier agent chains (offering tools), the latest whose first user message the summarising
        chain s repeats, else the latest."""
        vs = self.views[s]
        earlier = [j for j, v in enumerate(self.views) if j != s and v.offers_tools and v.started_at < vs.started_at]
        found = [j for j in earlier if self.views[j].first_user and self.views[j].first_user in vs.history]
        found = found or earlier
        return max(found, key=lambda j: self.views[j].started_at) if found else None

    def label(self, i: int) -> Lineage:
        start, v = self.chains[i].start, self.views[i]
        related = self.chain_of_call.get(start.related_call_id or "")
        if i in self.summarised and self.summarised[i] is not None:
            base = self.done[self.summarised[i]] or Lineage("main")
            return Lineage(base.role, self.summarised[i], base.spawned_by_call_id, base.tool_call_id,
                           base.segment, ("summarises",), True)
        if i in self.summaries or (start.kind == "break" and start.reason == "compaction" and related is not None):
            return self._continuation(i, related)
        if start.kind in ("fork", "break") and related is not None and self.done[related] is not None:
            base = self.done[related]
            return Lineage(base.role, base.parent, base.spawned_by_call_id, base.tool_call_id, base.segment,
                           (start.kind,), base.compaction_summary)
        spawn = _find_spawn(v, self.views, self.used)
        if spawn is not None:
            evidence, s = spawn
            self.used.add(s.tool_call_id)
            return Lineage("subagent", self.chain_of_call[s.call_id], s.call_id, s.tool_call_id, 0, evidence)
        if self.agentic and not v.offers_tools and SIDE_CALL.search(v.opening):
            return Lineage("side_call", None, None, None, 0, ("no_tools", "side_prompt"))
        return Lineage("main")

    def _continuation(self, i: int, related: int | None) -> Lineage:
        """Chain i continues, after a compaction, the chain holding the summary (or the chain that
        chain summarised, when the summary was a chain of its own)."""
        if i in self.summaries:
            source = self.chain_of_call[self.summaries[i]]
            source = self.summarised.get(source, source) if self.summarised.get(source) is not None else source
            evidence = ["summary"]
        else:
            source, evidence = related, ["break"]
        if any(m in self.views[i].history for m in COMPACTION_MARKERS):
            evidence.append("marker")
        base = self.done[source] if source is not None else None
        return Lineage("compaction_continuation", source, None, None, (base.segment if base else 0) + 1,
                       tuple(evidence))


def _find_spawn(v: ChainView, views: Sequence[ChainView], used: set[str]) -> tuple[tuple[str, ...], Spawn] | None:
    """The spawn tool call that started this chain: its prompt is in the first user message (or its result
    holds this chain's answer), made before this chain began and not yet taken."""
    best: tuple[int, float, tuple[str, ...], Spawn] | None = None
    for other in views:
        for s in other.spawns:
            if s.tool_call_id in used or s.ended_at > v.started_at or other is v:
                continue
            evidence = tuple(e for e, ok in (("prompt", s.prompt in v.first_user),
                                             ("result", bool(v.answer) and s.result is not None
                                              and v.answer in s.result)) if ok)
            if not evidence or "prompt" not in evidence and len(v.answer) < MIN_SUMMARY_CHARS:
                continue
            key = (len(evidence), s.ended_at, evidence, s)
            if best is None or key[:2] > best[:2]:
                best = key
    return None if best is None else (best[2], best[3])
