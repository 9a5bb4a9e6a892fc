"""OpenAI Responses output: the response object and its SSE event sequence.

Output items, in order: `reasoning` (full text in one `summary_text` part, and in
`encrypted_content` so it survives when a harness re-sends only the artefact), `message`
(one `output_text` part; present whenever there is text or no tool call), `function_call`s, or
`custom_tool_call`s for the request's custom tools (their `input` is the call's `input` argument).
A reply cut at max tokens has status `incomplete` with `incomplete_details.reason =
max_output_tokens`; the stream still ends with `response.completed` (codex treats any other
ending as a dropped stream and retries).
"""
from __future__ import annotations

import json
from typing import Any

from polar_mitm.conversation import (
    Completion,
    ContentDelta,
    ProviderError,
    ReasoningDelta,
    ReplyEvent,
    ToolCall,
    ToolCallDone,
)
from polar_mitm.providers._common import effective_finish, encode_reasoning, now, sse
from polar_mitm.providers.openai_chat import error_code


def item_id(kind: str, completion_id: str, index: int) -> str:
    return f"{kind}_{completion_id.removeprefix('resp_')}_{index}"


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def reasoning_item(iid: str, text: str) -> dict[str, Any]:
    return {"id": iid, "type": "reasoning", "summary": [{"type": "summary_text", "text": text}],
            "encrypted_content": encode_reasoning(text)}


def message_item(iid: str, text: str) -> dict[str, Any]:
    return {"id": iid, "type": "message", "role": "assistant", "status": "completed", "content": [_text_part(text)]}


def call_item(iid: str, call: ToolCall, status: str = "completed", arguments: str | None = None) -> dict[str, Any]:
    args = call.arguments if arguments is None else arguments
    return {"id": iid, "type": "function_call", "call_id": call.id, "name": call.name, "arguments": args,
            "status": status}


def custom_input(call: ToolCall) -> str:
    """A custom tool's raw input: the `input` string the model gave it (offered as a function of one string),
    else its arguments as written."""
    try:
        args = json.loads(call.arguments)
    except ValueError:
        return call.arguments
    return args["input"] if isinstance(args, dict) and isinstance(args.get("input"), str) else call.arguments


def custom_item(iid: str, call: ToolCall, status: str = "completed", text: str | None = None) -> dict[str, Any]:
    return {"id": iid, "type": "custom_tool_call", "call_id": call.id, "name": call.name,
            "input": custom_input(call) if text is None else text, "status": status}


def usage(c: Completion) -> dict[str, Any]:
    return {
        "input_tokens": c.prompt_tokens,
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": c.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": c.prompt_tokens + c.completion_tokens,
    }


def response_object(cid: str, model: str, created: int, output: list[dict[str, Any]], status: str,
                    **extra: Any) -> dict[str, Any]:
    return {
        "id": cid, "object": "response", "created_at": created, "status": status, "background": False,
        "error": None, "incomplete_details": None, "instructions": None, "max_output_tokens": None,
        "model": model, "output": output, "parallel_tool_calls": True, "previous_response_id": None,
        "reasoning": {"effort": None, "summary": None}, "store": False, "temperature": None,
        "text": {"format": {"type": "text"}}, "tool_choice": "auto", "tools": [], "top_p": None,
        "truncation": "disabled", "usage": None, "metadata": {}, **extra,
    }


def _final_fields(c: Completion) -> dict[str, Any]:
    incomplete = effective_finish(c) == "length"
    return {
        "status": "incomplete" if incomplete else "completed",
        "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
        "usage": usage(c),
    }


def render_response(completion: Completion, custom_tools: frozenset[str] = frozenset()) -> dict[str, Any]:
    c = completion
    output: list[dict[str, Any]] = []
    if c.reasoning:
        output.append(reasoning_item(item_id("rs", c.id, len(output)), c.reasoning))
    if c.content or not c.tool_calls:
        output.append(message_item(item_id("msg", c.id, len(output)), c.content))
    for call in c.tool_calls:
        if call.name in custom_tools:
            output.append(custom_item(item_id("ctc", c.id, len(output)), call))
        else:
            output.append(call_item(item_id("fc", c.id, len(output)), call))
    final = _final_fields(c)
    return response_object(c.id, c.model, now(), output, **final)


def _failure_code(err: ProviderError) -> str:
    code = error_code(err)
    if code:
        return code
    if err.status == 429:
        return "rate_limit_exceeded"
    return "invalid_prompt" if err.status < 500 else "server_error"


class StreamEncoder:
    """Responses SSE: created, in_progress, per item added/deltas/done, completed; `event:` lines included."""

    def __init__(self, completion_id: str, model: str, *, prompt_tokens: int = 0,
                 custom_tools: frozenset[str] = frozenset()) -> None:
        self._custom = custom_tools
        self._id = completion_id
        self._model = model
        self._created = now()
        self._seq = 0
        self._output: list[dict[str, Any]] = []  # items already done
        self._open: str | None = None  # "reasoning" | "message": the item receiving deltas
        self._text = ""
        self._calls = 0

    def _event(self, kind: str, **fields: Any) -> bytes:
        payload = {"type": kind, "sequence_number": self._seq, **fields}
        self._seq += 1
        return sse(payload, event=kind)

    def _response(self, status: str, **extra: Any) -> dict[str, Any]:
        return response_object(self._id, self._model, self._created, list(self._output), status, **extra)

    def _where(self, kind: str) -> dict[str, Any]:
        index = len(self._output)
        return {"item_id": item_id(kind, self._id, index), "output_index": index}

    def start(self) -> bytes:
        return (self._event("response.created", response=self._response("in_progress"))
                + self._event("response.in_progress", response=self._response("in_progress")))

    def _open_item(self, kind: str) -> bytes:
        self._open, self._text = kind, ""
        if kind == "reasoning":
            where = self._where("rs")
            item = {"id": where["item_id"], "type": "reasoning", "summary": []}
            return (self._event("response.output_item.added", output_index=where["output_index"], item=item)
                    + self._event("response.reasoning_summary_part.added", **where, summary_index=0,
                                  part={"type": "summary_text", "text": ""}))
        where = self._where("msg")
        item = {"id": where["item_id"], "type": "message", "role": "assistant", "status": "in_progress",
                "content": []}
        return (self._event("response.output_item.added", output_index=where["output_index"], item=item)
                + self._event("response.content_part.added", **where, content_index=0, part=_text_part("")))

    def _close_item(self) -> bytes:
        if self._open is None:
            return b""
        text = self._text
        if self._open == "reasoning":
            where = self._where("rs")
            item = reasoning_item(where["item_id"], text)
            out = (self._event("response.reasoning_summary_text.done", **where, summary_index=0, text=text)
                   + self._event("response.reasoning_summary_part.done", **where, summary_index=0,
                                 part={"type": "summary_text", "text": text}))
        else:
            where = self._where("msg")
            item = message_item(where["item_id"], text)
            out = (self._event("response.output_text.done", **where, content_index=0, text=text, logprobs=[])
                   + self._event("response.content_part.done", **where, content_index=0, part=_text_part(text)))
        out += self._event("response.output_item.done", output_index=where["output_index"], item=item)
        self._output.append(item)
        self._open, self._text = None, ""
        return out

    def _delta(self, kind: str, text: str) -> bytes:
        if not text:
            return b""
        out = b"" if self._open == kind else self._close_item() + self._open_item(kind)
        self._text += text
        if kind == "reasoning":
            return out + self._event("response.reasoning_summary_text.delta", **self._where("rs"),
                                     summary_index=0, delta=text)
        return out + self._event("response.output_text.delta", **self._where("msg"), content_index=0,
                                 delta=text, logprobs=[])

    def _call(self, call: ToolCall) -> bytes:
        """One call item: added, its arguments (a custom tool's raw input) as delta and done, then done."""
        out = self._close_item()
        custom = call.name in self._custom
        where = self._where("ctc" if custom else "fc")
        index, iid = where["output_index"], where["item_id"]
        self._calls += 1
        if custom:
            done, started = custom_item(iid, call), custom_item(iid, call, "in_progress", "")
            text = done["input"]
            fields = [("response.custom_tool_call_input.delta", {"delta": text}),
                      ("response.custom_tool_call_input.done", {"input": text})]
        else:
            done, started = call_item(iid, call), call_item(iid, call, "in_progress", "")
            fields = [("response.function_call_arguments.delta", {"delta": call.arguments}),
                      ("response.function_call_arguments.done", {"name": call.name, "arguments": call.arguments})]
        self._output.append(done)
        return (out + self._event("response.output_item.added", output_index=index, item=started)
                + b"".join(self._event(kind, **where, **extra) for kind, extra in fields)
                + self._event("response.output_item.done", output_index=index, item=done))

    def feed(self, event: ReplyEvent) -> bytes:
        if isinstance(event, ReasoningDelta):
            return self._delta("reasoning", event.text)
        if isinstance(event, ContentDelta):
            return self._delta("message", event.text)
        if isinstance(event, ToolCallDone):
            return self._call(event.call)
        raise TypeError(f"unknown reply event {event!r}")

    def finish(self, completion: Completion) -> bytes:
        out = self._close_item()
        has_message = any(item["type"] == "message" for item in self._output)
        if not has_message and not self._calls:
            out += self._open_item("message") + self._close_item()
        return out + self._event("response.completed", response=self._response(**_final_fields(completion)))

    def fail(self, err: ProviderError) -> bytes:
        """An error after the stream began: `response.failed` with the error's code and message."""
        error = {"code": _failure_code(err), "message": err.message}
        return self._close_item() + self._event("response.failed", response=self._response("failed", error=error))
