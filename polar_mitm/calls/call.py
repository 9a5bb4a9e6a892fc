"""One LLM call through the proxy: its state from request to record, as plain functions."""
from __future__ import annotations

import hashlib
import time
import uuid
from array import array
from dataclasses import dataclass, field
from typing import Any, Sequence

from polar_mitm.conversation import Completion, Conversation, Message, ReplyEvent
from polar_mitm.engines.api import EngineOutput
from polar_mitm.engines.chat import ENGINE_SOURCE, EngineReply, apply_chat
from polar_mitm.providers.routes import Route
from polar_mitm.sessions.registry import Session
from polar_mitm.tokens.detok import Detokenizer
from polar_mitm.tokens.prompt import CallTokens, Prompt
from polar_mitm.tokens.reply_parser import ReplyParser, finish_reason
from polar_traj.records import CallRecord

# A call refused before it reached the engine keeps at most this much of its body in its record (with the
# body's length and sha256): a session must not turn refused calls into tens of MiB of capture.
REFUSED_BODY_KEEP = 64 * 2**10


@dataclass
class Call:
    call_id: str
    session: Session
    route: Route
    conv: Conversation
    request_body: dict[str, Any]
    started_at: float
    prompt: Prompt | None = None
    output: EngineOutput = field(default_factory=EngineOutput)
    detok: Detokenizer | None = None  # None for an engine-rendered call: the engine's message is the reply
    parser: ReplyParser | EngineReply | None = None
    engine_request: tuple[str, dict[str, Any]] | None = None  # (path, body) for the engine's token API
    flags: list[str] = field(default_factory=list)  # e.g. "template_dropped_tools", "truncated"
    recorded: bool = False
    engine: str | None = None  # the replica's URL (polar_mitm/engines/replicas.py)
    raw_body: bytes = b""  # the body as received, kept only until the call is sent (for a refused call's record)
    large: bool = False  # its parsing, prompt and record are worked off the event loop (dispatch.OFF_LOOP_BYTES)


def new_call_id() -> str:
    return "call-" + uuid.uuid4().hex[:20]


def feed_ids(call: Call, ids: list[int], stop_ids: frozenset[int]) -> list[ReplyEvent]:
    """Turn newly sampled ids into reply events (text, reasoning, finished tool calls)."""
    text = call.detok.feed([t for t in ids if t not in stop_ids])
    return call.parser.feed(text) if text else []


def rendered_by_engine(call: Call) -> bool:
    """The engine renders this call's prompt and parses its reply (polar_mitm/engines/chat.py)."""
    return isinstance(call.parser, EngineReply)


def take_chat(call: Call, data: dict[str, Any]) -> list[ReplyEvent]:
    """One chat answer of the engine (whole, or a streamed chunk) for an engine-rendered call: its prompt ids
    become the call's prompt, its ids and logprobs the output, its message the reply's events."""
    prompt_ids, events = apply_chat(data, call.output, call.parser)
    if prompt_ids is not None and call.prompt is None:
        call.prompt = Prompt(prompt_ids, ENGINE_SOURCE, None, [])
    return events


def finish_events(call: Call) -> list[ReplyEvent]:
    tail = call.detok.flush() if call.detok is not None else ""
    events = call.parser.feed(tail) if tail else []
    return events + call.parser.finish()


def completion_of(call: Call, stop_ids: frozenset[int]) -> Completion:
    reply = call.parser.result()
    out = call.output
    # The budget ran out exactly on the end-of-turn token: the turn is complete, not cut short.
    cut_short = out.finish_reason == "length" and not (out.output_ids and out.output_ids[-1] in stop_ids)
    return Completion(
        id=call.call_id, model=call.conv.model, content=reply.content, reasoning=reply.reasoning,
        tool_calls=reply.tool_calls, finish_reason=finish_reason("length" if cut_short else "stop", reply),
        prompt_tokens=len(call.prompt.ids) if call.prompt else 0, completion_tokens=len(out.output_ids),
    )


def reply_message(c: Completion) -> Message:
    return Message("assistant", c.content, c.reasoning, c.tool_calls)


def call_tokens(call: Call, stop_ids: frozenset[int]) -> CallTokens:
    ids = call.output.output_ids
    return CallTokens.of(call.call_id, call.prompt, ids, bool(ids) and ids[-1] in stop_ids)


def make_record(call: Call, response: dict[str, Any] | None, error: str | None = None,
                flags: tuple[str, ...] = ()) -> CallRecord:
    ended = time.time()
    out = call.output
    return CallRecord(
        call_id=call.call_id, task_id=call.session.task_id, session_id=call.session.session_id,
        api=call.route.api, model=call.conv.model, stream=call.conv.stream,
        started_at=call.started_at, ended_at=ended, latency_ms=round((ended - call.started_at) * 1000, 3),
        policy_version=out.weight_version,
        prompt_ids=_kept(call.prompt.ids) if call.prompt else (),
        output_ids=tuple(out.output_ids), output_logprobs=tuple(out.logprobs),
        finish_reason=out.finish_reason, prefix_source=call.prompt.source if call.prompt else "rendered:none",
        parent_call_id=call.prompt.parent_call_id if call.prompt else None,
        request=recorded_request(call), response=response, error=error, flags=flags, engine=call.engine,
    )


def _kept(ids: Sequence[int]) -> Sequence[int]:
    """The prompt ids as the record keeps them: an array('i') as it is (written from its buffer), else a tuple."""
    return ids if isinstance(ids, array) else tuple(ids)


def recorded_request(call: Call) -> dict[str, Any]:
    """The request as the record keeps it: whole once the call was sent to the engine; for a call refused
    before that, whole only when small, else a bounded head of the body with its length and digest."""
    raw = call.raw_body
    parsed = bool(call.request_body) or not raw  # a call refused by a quota was never parsed
    if call.engine_request is not None or (parsed and len(raw) <= REFUSED_BODY_KEEP):
        return call.request_body
    return {"polar_refused_body": {"bytes": len(raw), "sha256": hashlib.sha256(raw).hexdigest(),
                                   "head": raw[:REFUSED_BODY_KEEP].decode("utf-8", "replace")}}
