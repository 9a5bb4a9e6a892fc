"""The official provider SDKs as a harness would use them, either way in: a two-turn tool exchange.

Each `run_*` sends a first request offering a shell tool, checks nothing itself, and returns what the
SDK parsed so the test can assert on it; then sends the tool result and returns the final text.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import anthropic
import httpx
import openai
from google import genai
from google.genai import types as gtypes

SHELL_SCHEMA = {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}
INSTRUCTION = "Create polar.txt"


@dataclass
class Way:
    """How a client reaches the proxy: through HTTPS_PROXY (real hostnames, proxy CA) or a base URL."""

    proxy_url: str | None
    ca: str | None
    base_url: str | None
    key: str

    def http_client(self) -> httpx.Client | None:
        if self.proxy_url is None:
            return None
        return httpx.Client(proxy=self.proxy_url, verify=self.ca, timeout=60)


@dataclass
class Turn:
    tool_name: str | None
    tool_args: dict[str, Any] | None
    text: str


def openai_chat(way: Way, stream: bool, tools: bool = True, max_tokens: int | None = None) -> list[Turn]:
    client = openai.OpenAI(api_key=way.key, base_url=(way.base_url + "/v1") if way.base_url else None,
                           http_client=way.http_client(), max_retries=0)
    tool_list = [{"type": "function", "function": {"name": "shell", "description": "Run a shell command",
                                                   "parameters": SHELL_SCHEMA}}] if tools else openai.NOT_GIVEN
    messages: list[Any] = [{"role": "system", "content": "You are a coding agent."},
                           {"role": "user", "content": INSTRUCTION}]
    turns = []
    for _ in range(2):
        kwargs = dict(model="tiny", messages=messages, tools=tool_list, temperature=0, max_tokens=max_tokens)
        if stream:
            try:
                with client.chat.completions.stream(**kwargs, stream_options={"include_usage": True}) as s:
                    msg = s.get_final_completion().choices[0].message
            except openai.LengthFinishReasonError as e:  # the helper refuses a cut-off reply; keep it anyway
                msg = e.completion.choices[0].message
        else:
            msg = client.chat.completions.create(**kwargs).choices[0].message
        call = msg.tool_calls[0] if msg.tool_calls else None
        turns.append(Turn(call and call.function.name, call and json.loads(call.function.arguments),
                          msg.content or ""))
        if call is None:
            break
        messages += [msg.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": call.id, "content": "written"}]
    return turns


def openai_responses(way: Way, stream: bool, tools: bool = True, max_tokens: int | None = None) -> list[Turn]:
    client = openai.OpenAI(api_key=way.key, base_url=(way.base_url + "/v1") if way.base_url else None,
                           http_client=way.http_client(), max_retries=0)
    tool_list = [{"type": "function", "name": "shell", "description": "Run a shell command",
                  "parameters": SHELL_SCHEMA, "strict": False}] if tools else openai.NOT_GIVEN
    items: list[Any] = [{"role": "developer", "content": "You are a coding agent."},
                        {"role": "user", "content": INSTRUCTION}]
    turns = []
    for _ in range(2):
        kwargs = dict(model="tiny", input=items, tools=tool_list, temperature=0, max_output_tokens=max_tokens)
        if stream:
            with client.responses.stream(**kwargs) as s:
                resp = s.get_final_response()
        else:
            resp = client.responses.create(**kwargs)
        calls = [o for o in resp.output if o.type == "function_call"]
        call = calls[0] if calls else None
        turns.append(Turn(call and call.name, call and json.loads(call.arguments), resp.output_text))
        if call is None:
            break
        items += [o.model_dump(exclude_none=True) for o in resp.output]
        items.append({"type": "function_call_output", "call_id": call.call_id, "output": "written"})
    return turns


def anthropic_messages(way: Way, stream: bool, tools: bool = True, max_tokens: int | None = None) -> list[Turn]:
    client = anthropic.Anthropic(api_key=way.key, base_url=way.base_url, http_client=way.http_client(),
                                 max_retries=0)
    tool_list = [{"name": "shell", "description": "Run a shell command", "input_schema": SHELL_SCHEMA}] \
        if tools else anthropic.NOT_GIVEN
    messages: list[Any] = [{"role": "user", "content": INSTRUCTION}]
    turns = []
    for _ in range(2):
        kwargs = dict(model="tiny", system="You are a coding agent.", messages=messages, tools=tool_list,
                      max_tokens=max_tokens or 1024, temperature=0)
        if stream:
            with client.messages.stream(**kwargs) as s:
                msg = s.get_final_message()
        else:
            msg = client.messages.create(**kwargs)
        uses = [b for b in msg.content if b.type == "tool_use"]
        text = "".join(b.text for b in msg.content if b.type == "text")
        use = uses[0] if uses else None
        turns.append(Turn(use and use.name, use and dict(use.input), text))
        if use is None:
            break
        messages += [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in msg.content]},
                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                                   "content": "written"}]}]
    return turns


def gemini(way: Way, stream: bool, tools: bool = True, max_tokens: int | None = None) -> list[Turn]:
    client_args = {"proxy": way.proxy_url, "verify": way.ca} if way.proxy_url else None
    client = genai.Client(api_key=way.key, http_options=gtypes.HttpOptions(
        base_url=way.base_url, client_args=client_args, retry_options=gtypes.HttpRetryOptions(attempts=1)))
    decl = gtypes.FunctionDeclaration(name="shell", description="Run a shell command", parameters_json_schema=SHELL_SCHEMA)
    config = gtypes.GenerateContentConfig(
        system_instruction="You are a coding agent.", temperature=0, max_output_tokens=max_tokens,
        tools=[gtypes.Tool(function_declarations=[decl])] if tools else None,
        automatic_function_calling=gtypes.AutomaticFunctionCallingConfig(disable=True))
    contents: list[Any] = [gtypes.Content(role="user", parts=[gtypes.Part(text=INSTRUCTION)])]
    turns = []
    for _ in range(2):
        if stream:
            parts = [p for chunk in client.models.generate_content_stream(model="tiny", contents=contents, config=config)
                     for c in chunk.candidates or [] for p in (c.content.parts if c.content and c.content.parts else [])]
        else:
            resp = client.models.generate_content(model="tiny", contents=contents, config=config)
            parts = list(resp.candidates[0].content.parts or [])
        call = next((p.function_call for p in parts if p.function_call), None)
        text = "".join(p.text for p in parts if p.text and not p.thought)
        turns.append(Turn(call and call.name, call and dict(call.args or {}), text))
        if call is None:
            break
        contents += [gtypes.Content(role="model", parts=parts),
                     gtypes.Content(role="user", parts=[gtypes.Part.from_function_response(
                         name=call.name, response={"output": "written"})])]
    return turns


CLIENTS = {"openai_chat": openai_chat, "openai_responses": openai_responses,
           "anthropic": anthropic_messages, "gemini": gemini}
