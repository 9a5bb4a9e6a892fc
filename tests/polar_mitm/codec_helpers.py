"""Shared factories for the provider codec tests: fixtures, scripted replies, SSE through the real parser."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import httpx

from polar_mitm.conversation import Completion, Message
from polar_mitm.tokens.reply_parser import ReplyParser, finish_reason, parse_reply

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "requests"
BASE_URL = "http://polar.test"

# Reply texts as a Qwen-style model samples them, with what the engine said about how it ended.
REPLIES: dict[str, tuple[str, str]] = {
    "reasoning_text_tool": (
        "<think>\nThe test expects 4. Let me look at add().\n</think>\n\nI'll read the file.\n"
        '<tool_call>\n{"name": "read", "arguments": {"path": "math_utils.py", "limit": 40}}\n</tool_call>',
        "stop",
    ),
    "text_only": ("All tests pass now: `add` returns a + b. Résumé ✓ 日本語", "stop"),
    "two_tools": (
        '<tool_call>\n{"name": "bash", "arguments": {"command": "pytest -q"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "read", "arguments": {"path": "a \\"b\\".py"}}\n</tool_call>',
        "stop",
    ),
    "cut_in_reasoning": ("<think>\nStill thinking about the whole problem and", "length"),
    "unparsed_call": ("Trying a call.\n<tool_call>\n{not json}\n</tool_call>", "stop"),
    "empty": ("", "stop"),
}


def load_request(name: str) -> dict[str, Any]:
    return json.loads((FIXTURES / name).read_text())


def completion_for(scenario: str, completion_id: str, model: str = "polar-tiny") -> Completion:
    text, engine_finish = REPLIES[scenario]
    reply = parse_reply(text, call_id_prefix=f"call_{completion_id[-4:]}_")
    return Completion(completion_id, model, reply.content, reply.reasoning, reply.tool_calls,
                      finish_reason(engine_finish, reply), prompt_tokens=321, completion_tokens=45)


def stream_for(scenario: str, encoder: Any, completion: Completion, chunk: int = 3) -> bytes:
    """SSE bytes produced the live way: the reply text fed to ReplyParser a few characters at a time."""
    text, _ = REPLIES[scenario]
    parser = ReplyParser(call_id_prefix=f"call_{completion.id[-4:]}_")
    out = encoder.start()
    for i in range(0, len(text), chunk):
        for event in parser.feed(text[i:i + chunk]):
            out += encoder.feed(event)
    for event in parser.finish():
        out += encoder.feed(event)
    return out + encoder.finish(completion)


def expected_assistant(c: Completion) -> Message:
    return Message("assistant", c.content, c.reasoning, c.tool_calls)


def mock_http(answer: Callable[[dict[str, Any], httpx.Request], httpx.Response]) -> httpx.Client:
    """An httpx client whose transport hands each request body to `answer`: only our bytes reach the SDK."""

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content or b"{}")
        return answer(body, request)

    return httpx.Client(transport=httpx.MockTransport(handler))


def sse_response(data: bytes) -> httpx.Response:
    return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=data)


def sse_payloads(data: bytes) -> list[tuple[str | None, Any]]:
    """(event name, decoded data) for each SSE record; `[DONE]` stays a string."""
    records = []
    for block in data.decode("utf-8").split("\n\n"):
        if not block.strip():
            continue
        event = None
        payload = None
        for line in block.split("\n"):
            if line.startswith("event: "):
                event = line[len("event: "):]
            elif line.startswith("data: "):
                raw = line[len("data: "):]
                payload = raw if raw == "[DONE]" else json.loads(raw)
        records.append((event, payload))
    return records
