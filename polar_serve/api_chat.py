"""vLLM's `POST /v1/chat/completions` with token ids (`return_token_ids`, vLLM >= 0.10.2), one choice: the minimal
chat endpoint the proxy's engine-side rendering (`polar proxy --render engine`, issue 45 item 4) is tested
against. The server renders the messages with the model's own chat template (tool-call arguments given as JSON
text are read into objects first, as vLLM does) and answers with the parsed message.

As in vLLM, `prompt_token_ids` sits at the top of the response and `token_ids` in the choice. The parsed message:
a scripted policy's reply as the rule wrote it (reasoning, content, tool calls with ids `call_<n>`), else the
sampled text as content (this server parses no tool calls from free text). Streaming sends `token_ids` and
`logprobs` with every token, the message's parts in the last chunk with the finish reason (a real engine streams
text as it goes; the proxy takes either), the first chunk carries `prompt_token_ids`; then `data: [DONE]`."""
from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from typing import Any

from polar_serve.params import (BadRequest, as_object, get_bool, get_float, get_ids, get_int, get_strings,
                                require_neutral)
from polar_serve.sampling import SamplingParams
from polar_serve.sequence import Sequence

NEUTRAL = {"n": 1, "frequency_penalty": 0.0, "presence_penalty": 0.0, "repetition_penalty": 1.0, "min_p": 0.0,
           "echo": False, "min_tokens": 0}
TOOL_CHOICES = (None, "auto", "none")


@dataclass(frozen=True)
class ChatRequest:
    messages: list[dict[str, Any]]  # as the chat template takes them
    tools: list[dict[str, Any]] | None
    params: SamplingParams
    stream: bool
    logprobs: bool
    return_token_ids: bool
    include_usage: bool


def parse_request(raw: Any) -> ChatRequest:
    body = as_object(raw)
    require_neutral(body, NEUTRAL)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
        raise BadRequest("`messages` must be a non-empty list of message objects")
    tools = body.get("tools")
    if tools is not None and not (isinstance(tools, list) and all(isinstance(t, dict) for t in tools)):
        raise BadRequest("`tools` must be a list of tool objects")
    if body.get("tool_choice") not in TOOL_CHOICES:
        raise BadRequest(f"`tool_choice` {body.get('tool_choice')!r}: this server takes auto or none")
    top_k = get_int(body, "top_k", -1)
    options = as_object(body.get("stream_options") or {}, "`stream_options`")
    max_tokens = get_int(body, "max_completion_tokens", None) or get_int(body, "max_tokens", 16)
    params = SamplingParams(
        max_new_tokens=max_tokens,  # type: ignore[arg-type]
        temperature=get_float(body, "temperature", 1.0),
        top_p=get_float(body, "top_p", 1.0),
        top_k=-1 if top_k == 0 else top_k,  # type: ignore[arg-type]
        seed=get_int(body, "seed", None),
        stop=get_strings(body, "stop"),
        stop_token_ids=get_ids(body, "stop_token_ids"),
        skip_special_tokens=get_bool(body, "skip_special_tokens", True),
    )
    if params.max_new_tokens < 1:
        raise BadRequest(f"`max_tokens` must be at least 1, got {params.max_new_tokens}")
    return ChatRequest([template_message(m) for m in messages], tools or None, params, get_bool(body, "stream", False),
                       get_bool(body, "logprobs", False), get_bool(body, "return_token_ids", False),
                       get_bool(options, "include_usage", False))


def template_message(m: dict[str, Any]) -> dict[str, Any]:
    """A message as chat templates take it: tool-call arguments as objects (they arrive as JSON text)."""
    if not m.get("tool_calls"):
        return m
    calls = []
    for call in m["tool_calls"]:
        fn = dict((call or {}).get("function") or {})
        if isinstance(fn.get("arguments"), str):
            try:
                fn["arguments"] = json.loads(fn["arguments"] or "{}")
            except json.JSONDecodeError as e:
                raise BadRequest(f"a tool call's arguments are not JSON: {e}") from e
        calls.append({**call, "function": fn})
    return {**m, "tool_calls": calls}


def prompt_ids(tokenizer: Any, req: ChatRequest) -> list[int]:
    """The messages rendered by the model's chat template, with the generation prompt, as token ids."""
    try:
        text = tokenizer.apply_chat_template(req.messages, tools=req.tools, add_generation_prompt=True,
                                             tokenize=False)
    except Exception as e:  # noqa: BLE001 — jinja's errors: the messages do not fit the template
        raise BadRequest(f"the chat template refuses these messages: {type(e).__name__}: {e}") from e
    return list(tokenizer.encode(text, add_special_tokens=False))


class Renderer:
    def __init__(self, req: ChatRequest, model_name: str) -> None:
        self.req, self.model_name = req, model_name
        self.id, self.created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
        self.sent, self.first = 0, True  # tokens sent in earlier chunks; no chunk sent yet

    def message(self, seq: Sequence) -> tuple[dict[str, Any], str]:
        """The parsed assistant message and the finish reason."""
        reason = seq.finish.reason if seq.finish else "stop"
        scripted = seq.scripted
        if scripted is None or reason == "length":  # free text, or a scripted reply cut short: its text as sampled
            return {"role": "assistant", "content": seq.engine.decode(seq.out.ids), "tool_calls": []}, reason
        calls = [{"id": f"call_{i}", "type": "function",
                  "function": {"name": name, "arguments": args if isinstance(args, str) else json.dumps(args)}}
                 for i, (name, args) in enumerate(scripted.calls)]
        message = {"role": "assistant", "content": scripted.content or None, "tool_calls": calls}
        if scripted.think is not None:
            message["reasoning_content"] = scripted.think
        return message, "tool_calls" if calls else reason

    def _logprobs(self, seq: Sequence, start: int) -> dict[str, Any] | None:
        if not self.req.logprobs:
            return None
        return {"content": [{"token": seq.engine.token_text(t), "logprob": lp, "top_logprobs": []}
                            for t, lp in zip(seq.out.ids[start:], seq.out.logprobs[start:])]}

    def usage(self, seq: Sequence) -> dict[str, Any]:
        n_prompt, n_out = len(seq.prompt_ids), len(seq.out.ids)
        return {"prompt_tokens": n_prompt, "completion_tokens": n_out, "total_tokens": n_prompt + n_out}

    def _envelope(self, kind: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model_name, "choices": choices}

    def response(self, seq: Sequence) -> dict[str, Any]:
        message, reason = self.message(seq)
        choice: dict[str, Any] = {"index": 0, "message": message, "logprobs": self._logprobs(seq, 0),
                                  "finish_reason": reason}
        out = self._envelope("chat.completion", [choice])
        out["usage"] = self.usage(seq)
        if self.req.return_token_ids:
            choice["token_ids"] = list(seq.out.ids)
            out["prompt_token_ids"] = list(seq.prompt_ids)
        return out

    def chunk(self, seq: Sequence) -> dict[str, Any]:
        start, first, self.first = self.sent, self.first, False
        delta: dict[str, Any] = {"role": "assistant", "content": ""} if first else {}
        reason = None
        if seq.finished:
            message, reason = self.message(seq)
            delta.update({k: v for k, v in message.items() if k != "role" and v})
        choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": self._logprobs(seq, start),
                                  "finish_reason": reason}
        out = self._envelope("chat.completion.chunk", [choice])
        if self.req.return_token_ids:
            choice["token_ids"] = list(seq.out.ids[start:])
            if first:
                out["prompt_token_ids"] = list(seq.prompt_ids)
        self.sent = len(seq.out.ids)
        return out

    def usage_chunk(self, seq: Sequence) -> dict[str, Any]:
        out = self._envelope("chat.completion.chunk", [])
        out["usage"] = self.usage(seq)
        return out
