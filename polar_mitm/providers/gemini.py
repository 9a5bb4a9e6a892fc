"""Gemini codec (`/v1beta/models/{m}:generateContent`, `:streamGenerateContent?alt=sse`, `:countTokens`; gemini, pi).

The model and whether to stream come from the path. Request: `systemInstruction` is the leading
system message; `functionResponse` parts of a user turn become tool messages in place (matched to
their call by `id`, else to the oldest unanswered call of that name: gemini-cli invents ids when
the model's call had none); a functionCall without `id` gets `call_<turn>_<n>`; in a model turn, `thought`
parts are reasoning, unless a part carries a `thoughtSignature` Polar made (see
`_common.encode_reasoning`), which then gives the reasoning exactly. Model-turn text parts are
concatenated as they come (a stream splits text anywhere); user-turn text parts are joined by a
newline. Only `functionDeclarations` tools are kept (`parametersJsonSchema`, or `parameters` with
its OpenAPI type names lower-cased); inline/file data become a text placeholder. camelCase and
snake_case field names are both accepted.
Response: parts `thought` text, text, `functionCall` (with `id`); the `thoughtSignature` goes on
the first functionCall part, else on the text part, else on an empty text part (never on a
thought part, which harnesses drop).
"""
from __future__ import annotations

import json
import re
from typing import Any, Sequence
from urllib.parse import unquote, urlsplit

from polar_mitm.conversation import (
    Completion,
    ContentDelta,
    Conversation,
    Message,
    ProviderError,
    ReasoningDelta,
    ReplyEvent,
    Sampling,
    Tool,
    ToolCall,
    ToolCallDone,
)
from polar_mitm.providers._common import (
    PART_SEPARATOR,
    SYSTEM_SEPARATOR,
    Transcript,
    bad,
    canonical_arguments,
    decode_reasoning,
    effective_finish,
    encode_reasoning,
    expect_dict,
    expect_list,
    media_placeholder,
    opt_float,
    opt_int,
    opt_stop,
    opt_str,
    req_str,
    sse,
)

API = "gemini"
METHODS = ("generateContent", "streamGenerateContent", "countTokens")
_ROUTE = re.compile(r"/models/([^/:]+):([A-Za-z]+)$")
_MEDIA = ("inlineData", "inline_data", "fileData", "file_data")
_STATUS = {400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED", 404: "NOT_FOUND",
           407: "UNAUTHENTICATED", 413: "INVALID_ARGUMENT", 429: "RESOURCE_EXHAUSTED", 500: "INTERNAL",
           501: "UNIMPLEMENTED", 503: "UNAVAILABLE", 504: "DEADLINE_EXCEEDED"}


def _get(d: dict[str, Any], camel: str, snake: str) -> Any:
    return d[camel] if camel in d else d.get(snake)


def _key(d: dict[str, Any], camel: str, snake: str) -> str:
    return camel if camel in d else snake


def route(path: str) -> tuple[str, str]:
    """(model, method) from `…/models/{model}:{method}[?…]`."""
    match = _ROUTE.search(urlsplit(path).path)
    if match is None or match.group(2) not in METHODS:
        raise bad(f"unsupported Gemini path {path!r}; expected /v1beta/models/MODEL:{{{','.join(METHODS)}}}")
    return unquote(match.group(1)), match.group(2)


# ---------------------------------------------------------------- request


def parse_request(body: dict[str, Any], path: str) -> Conversation:
    model, method = route(path)
    body = expect_dict(body, "request body")
    if method == "countTokens" and _get(body, "generateContentRequest", "generate_content_request"):
        body = expect_dict(_get(body, "generateContentRequest", "generate_content_request"), "generateContentRequest")
        model = str(body.get("model") or model).removeprefix("models/")
    contents = expect_list(body.get("contents"), "contents")
    if not contents:
        raise bad("contents must not be empty")
    transcript = Transcript()
    transcript.add_system(_system(_get(body, "systemInstruction", "system_instruction")))
    pending: dict[str, list[str]] = {}  # tool name -> ids of calls not yet answered
    for i, content in enumerate(contents):
        where = f"contents[{i}]"
        content = expect_dict(content, where)
        role = content.get("role") or "user"
        parts = expect_list(content.get("parts") or [], f"{where}.parts")
        if role == "model":
            message = _model_turn(parts, where, i)
            for call in message.tool_calls:
                pending.setdefault(call.name, []).append(call.id)
            transcript.add(message)
        elif role in ("user", "function", "tool"):
            _add_user(transcript, parts, where, pending)
        else:
            raise bad(f"{where}.role {role!r} is not supported")
    config = expect_dict(_get(body, "generationConfig", "generation_config") or {}, "generationConfig")
    return Conversation(API, model, transcript.build(), _tools(body.get("tools")), _sampling(config),
                        stream=method == "streamGenerateContent")


def encoder_options(body: dict[str, Any]) -> dict[str, Any]:
    """Extra StreamEncoder keyword arguments this request asks for (none for Gemini)."""
    return {}


def _system(value: Any) -> str:
    if value is None or isinstance(value, str):
        return value or ""
    parts = expect_list(expect_dict(value, "systemInstruction").get("parts") or [], "systemInstruction.parts")
    return SYSTEM_SEPARATOR.join(_text(expect_dict(p, "systemInstruction.parts[]"), "systemInstruction.parts[]")
                                 for p in parts)


def _text(part: dict[str, Any], where: str) -> str:
    if "text" in part:
        if not isinstance(part["text"], str):
            raise bad(f"{where}.text must be a string")
        return part["text"]
    for key in _MEDIA:
        if key in part:
            return media_placeholder(key)
    raise bad(f"{where}: part {sorted(part)} is not supported")


def _add_user(transcript: Transcript, parts: list[Any], where: str, pending: dict[str, list[str]]) -> None:
    parts = [expect_dict(part, f"{where}.parts[{j}]") for j, part in enumerate(parts)]
    _claim_known_ids(parts, pending)
    texts: list[str] = []
    added = False
    for j, part in enumerate(parts):
        at = f"{where}.parts[{j}]"
        response = _get(part, "functionResponse", "function_response")
        if response is None:
            texts.append(_text(part, at))
            continue
        if texts:
            transcript.add(Message("user", PART_SEPARATOR.join(texts)))
            texts = []
        response = expect_dict(response, f"{at}.functionResponse")
        name = req_str(response, "name", f"{at}.functionResponse")
        call_id = opt_str(response, "id", f"{at}.functionResponse")
        waiting = pending.get(name, [])
        if not transcript.knows(call_id) and waiting:
            call_id = waiting.pop(0)  # no id, or one the harness made up: the oldest unanswered call of that name
        output = _response_text(response.get("response"), f"{at}.functionResponse.response")
        transcript.add(Message("tool", output, tool_call_id=call_id, name=name))
        added = True
    if texts or not added:
        transcript.add(Message("user", PART_SEPARATOR.join(texts)))


def _claim_known_ids(parts: list[dict[str, Any]], pending: dict[str, list[str]]) -> None:
    """Responses that name a call's id answer that call: take those calls off the waiting lists first."""
    for part in parts:
        response = _get(part, "functionResponse", "function_response")
        if isinstance(response, dict) and response.get("id") in pending.get(response.get("name"), []):
            pending[response["name"]].remove(response["id"])


def _response_text(response: Any, where: str) -> str:
    """A single string field (`output`, `content`, `error`…) is the text; anything else is its JSON."""
    response = expect_dict(response or {}, where)
    values = list(response.values())
    if len(values) == 1 and isinstance(values[0], str):
        return values[0]
    return json.dumps(response, ensure_ascii=False)


def _model_turn(parts: list[Any], where: str, turn: int) -> Message:
    content: list[str] = []
    thoughts: list[str] = []
    signed: list[str] = []
    calls: list[ToolCall] = []
    for j, part in enumerate(parts):
        at = f"{where}.parts[{j}]"
        part = expect_dict(part, at)
        decoded = decode_reasoning(_get(part, "thoughtSignature", "thought_signature"))
        if decoded is not None:
            signed.append(decoded)
        call = _get(part, "functionCall", "function_call")
        if call is not None:
            call = expect_dict(call, f"{at}.functionCall")
            call_id = opt_str(call, "id", f"{at}.functionCall") or f"call_{turn}_{len(calls)}"
            arguments = canonical_arguments(expect_dict(call.get("args") or {}, f"{at}.functionCall.args"), at)
            calls.append(ToolCall(call_id, req_str(call, "name", f"{at}.functionCall"), arguments))
        elif part.get("thought") is True:
            thoughts.append(_text(part, at) if "text" in part else "")
        elif set(part) - {"thoughtSignature", "thought_signature", "thought"}:
            content.append(_text(part, at))
    reasoning = PART_SEPARATOR.join(signed) if signed else "".join(thoughts)
    return Message("assistant", "".join(content), reasoning or None, tuple(calls))


def _lower_types(schema: Any) -> Any:
    """OpenAPI-style `parameters` (`"type": "OBJECT"`) as JSON Schema (`"type": "object"`)."""
    if isinstance(schema, dict):
        return {k: v.lower() if k == "type" and isinstance(v, str) else _lower_types(v) for k, v in schema.items()}
    if isinstance(schema, list):
        return [_lower_types(v) for v in schema]
    return schema


def _tools(tools: Any) -> tuple[Tool, ...]:
    """Function declarations; built-in tools (googleSearch, codeExecution, …) are dropped."""
    out: list[Tool] = []
    for i, tool in enumerate(expect_list(tools or [], "tools")):
        tool = expect_dict(tool, f"tools[{i}]")
        declarations = _get(tool, "functionDeclarations", "function_declarations") or []
        for j, decl in enumerate(expect_list(declarations, f"tools[{i}].functionDeclarations")):
            at = f"tools[{i}].functionDeclarations[{j}]"
            decl = expect_dict(decl, at)
            schema = _get(decl, "parametersJsonSchema", "parameters_json_schema")
            if schema is None:
                schema = _lower_types(decl.get("parameters") or {})
            description = opt_str(decl, "description", at) or ""
            out.append(Tool(req_str(decl, "name", at), description, expect_dict(schema, f"{at}.parameters")))
    return tuple(out)


def _sampling(config: dict[str, Any]) -> Sampling:
    where = "generationConfig"
    return Sampling(
        max_tokens=opt_int(config, _key(config, "maxOutputTokens", "max_output_tokens"), where),
        temperature=opt_float(config, "temperature", where),
        top_p=opt_float(config, _key(config, "topP", "top_p"), where),
        top_k=opt_int(config, _key(config, "topK", "top_k"), where),
        stop=opt_stop(config, _key(config, "stopSequences", "stop_sequences"), where),
        seed=opt_int(config, "seed", where),
    )


# ---------------------------------------------------------------- response


def _usage(c: Completion) -> dict[str, int]:
    return {"promptTokenCount": c.prompt_tokens, "candidatesTokenCount": c.completion_tokens,
            "totalTokenCount": c.prompt_tokens + c.completion_tokens}


def _function_call(call: ToolCall) -> dict[str, Any]:
    return {"functionCall": {"id": call.id, "name": call.name, "args": call.args()}}


def _finish(c: Completion) -> str:
    return "MAX_TOKENS" if effective_finish(c) == "length" else "STOP"


def _envelope(parts: list[dict[str, Any]], completion_id: str, model: str, **extra: Any) -> dict[str, Any]:
    candidate = {"content": {"role": "model", "parts": parts}, "index": 0}
    if "finishReason" in extra:
        candidate["finishReason"] = extra.pop("finishReason")
    return {"candidates": [candidate], **extra, "modelVersion": model, "responseId": completion_id}


def render_response(completion: Completion, **_options: Any) -> dict[str, Any]:
    c = completion
    parts: list[dict[str, Any]] = []
    if c.reasoning:
        parts.append({"text": c.reasoning, "thought": True})
    if c.content:
        parts.append({"text": c.content})
    calls = [_function_call(call) for call in c.tool_calls]
    parts += calls
    if c.reasoning:  # never on the thought part: harnesses drop those, and the signature must survive
        signature = encode_reasoning(c.reasoning)
        if calls:
            calls[0]["thoughtSignature"] = signature
        elif c.content:
            parts[-1]["thoughtSignature"] = signature
        else:
            parts.append({"text": "", "thoughtSignature": signature})
    return _envelope(parts or [{"text": ""}], c.id, c.model, finishReason=_finish(c), usageMetadata=_usage(c))


class StreamEncoder:
    """`data: GenerateContentResponse` chunks, one part each; the last part is held back so that the
    final chunk carries it with finishReason, usageMetadata and (without tool calls) the signature."""

    def __init__(self, completion_id: str, model: str, *, prompt_tokens: int = 0) -> None:
        self._id = completion_id
        self._model = model
        self._held: dict[str, Any] | None = None
        self._reasoning = ""
        self._signed = False

    def _push(self, part: dict[str, Any]) -> bytes:
        out = sse(_envelope([self._held], self._id, self._model)) if self._held else b""
        self._held = part
        return out

    def start(self) -> bytes:
        return b""

    def feed(self, event: ReplyEvent) -> bytes:
        if isinstance(event, ReasoningDelta):
            self._reasoning += event.text
            return self._push({"text": event.text, "thought": True}) if event.text else b""
        if isinstance(event, ContentDelta):
            return self._push({"text": event.text}) if event.text else b""
        if isinstance(event, ToolCallDone):
            part = _function_call(event.call)
            if self._reasoning and not self._signed:
                part["thoughtSignature"] = encode_reasoning(self._reasoning)
                self._signed = True
            return self._push(part)
        raise TypeError(f"unknown reply event {event!r}")

    def finish(self, completion: Completion) -> bytes:
        out, part, self._held = b"", self._held, None
        if self._reasoning and not self._signed:
            if part is None or part.get("thought"):  # the signature never rides on a thought part
                out = sse(_envelope([part], self._id, self._model)) if part else b""
                part = {"text": ""}
            part = {**part, "thoughtSignature": encode_reasoning(self._reasoning)}
        final = _envelope([part or {"text": ""}], self._id, self._model, finishReason=_finish(completion),
                          usageMetadata=_usage(completion))
        return out + sse(final)

    def fail(self, err: ProviderError) -> bytes:
        """An error after the stream began: a `data:` line holding the error body."""
        return sse(render_error(err))


# ---------------------------------------------------------------- errors and side endpoints


def render_error(err: ProviderError) -> dict[str, Any]:
    """`{"error": {code, message, status}}`."""
    status = _STATUS.get(err.status, "INTERNAL" if err.status >= 500 else "FAILED_PRECONDITION")
    return {"error": {"code": err.status, "message": err.message, "status": status}}


def render_model(model_id: str) -> dict[str, Any]:
    """`GET /v1beta/models/{model}`."""
    return {"name": f"models/{model_id}", "baseModelId": model_id, "version": "polar", "displayName": model_id,
            "supportedGenerationMethods": list(METHODS)}


def render_models(model_ids: Sequence[str]) -> dict[str, Any]:
    """`GET /v1beta/models`."""
    return {"models": [render_model(m) for m in model_ids]}


def render_count_tokens(n: int) -> dict[str, int]:
    """`POST /v1beta/models/{model}:countTokens`."""
    return {"totalTokens": n}
