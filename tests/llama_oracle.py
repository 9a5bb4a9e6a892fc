"""Llama 3's reference encoding, run on llama-models' own venv (scripts/install_reference_libs.sh), never the
project's: `.tools/llama-models-venv/bin/python tests/llama_oracle.py < REQUEST.json`.

The request: {"chats": [{"messages": […], "tools": […] or null}, …], "export": a folder or null}, messages and
tools as the OpenAI Chat API takes them. The answer, as JSON on stdout: {"tokens": [the ids llama-models'
ChatFormat.encode_dialog_prompt gives each chat, ending at the assistant's header]}.

llama-models encodes the framing (headers, the ipython role of a tool result, <|eot_id|>, a custom call as
`{"type": "function", "name": …, "parameters": …}`) and tokenizes with the real Llama 3.1 vocabulary; the
words around the tools are Llama 3.1's documented JSON tool calling (llama_models/llama3_1/prompt_format.md):
"Environment: ipython" heads the system message, and the tools are a user message of their own after it. A
reply that calls tools ends its turn (<|eot_id|>), as a reply that answers does.
With "export": the folder gets tokenizer.model (the tiktoken ranks) and llama3.json (its split pattern and
special tokens), from which tests/llama_reference.py builds a Hugging Face tokenizer. Imports only llama_models
and the standard library."""
from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

import llama_models.llama3 as llama3
from llama_models.datatypes import RawMessage, StopReason, ToolCall, ToolPromptFormat
from llama_models.llama3.chat_format import ChatFormat
from llama_models.llama3.tokenizer import Tokenizer

TOOLS_INTRO = ("Answer the user's question by making use of the following functions if needed.\n"
               "If none of the function can be used, please say so.\n"
               "Here is a list of functions in JSON format:\n")
TOOLS_OUTRO = "\nReturn function calls in JSON format."


def _text(content: Any) -> str:
    return content if isinstance(content, str) else "".join(p.get("text", "") for p in content or [])


def _arguments(text: Any) -> dict[str, Any]:
    return text if isinstance(text, dict) else json.loads(text or "{}")


def _function(tool: dict[str, Any]) -> dict[str, Any]:
    """A tool as Llama 3.1's listing shows one: its name, description and parameters (keys such as OpenAI's
    `strict` are the API's, not the model's)."""
    fn = tool.get("function", tool)
    return {"type": "function", "function": {"name": fn["name"], "description": fn.get("description") or "",
                                             "parameters": fn.get("parameters") or {}}}


def raw_messages(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> list[RawMessage]:
    out: list[RawMessage] = []
    for m in messages:
        role, content = m["role"], _text(m.get("content"))
        if role in ("system", "developer"):
            out.append(RawMessage(role="system", content=content))
        elif role == "user":
            out.append(RawMessage(role="user", content=content))
        elif role == "tool":
            out.append(RawMessage(role="tool", content=content))
        elif role == "assistant":
            calls = [ToolCall(call_id=c.get("id") or str(i), tool_name=c["function"]["name"],
                              arguments=_arguments(c["function"]["arguments"]))
                     for i, c in enumerate(m.get("tool_calls") or [])]
            out.append(RawMessage(role="assistant", content=content, stop_reason=StopReason.end_of_turn,
                                  tool_calls=calls))
    if tools:
        environment = "Environment: ipython"
        if out and out[0].role == "system":
            head = out.pop(0)
            environment += "\n\n" + head.content if head.content else ""
        listing = "".join(json.dumps(_function(t), ensure_ascii=False, indent=4) + "\n" for t in tools)
        out[:0] = [RawMessage(role="system", content=environment),
                   RawMessage(role="user", content=TOOLS_INTRO + listing + TOOLS_OUTRO)]
    return out


def main() -> None:
    request = json.load(sys.stdin)
    tokenizer = Tokenizer.get_instance()
    chat = ChatFormat(tokenizer)
    tokens = [chat.encode_dialog_prompt(raw_messages(c["messages"], c.get("tools")), ToolPromptFormat.json).tokens
              for c in request["chats"]]
    if request.get("export"):
        folder = Path(request["export"])
        folder.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(Path(llama3.__file__).parent / "tokenizer.model", folder / "tokenizer.model")
        (folder / "llama3.json").write_text(json.dumps({"pattern": Tokenizer.pat_str,
                                                        "special_tokens": tokenizer.special_tokens}))
    json.dump({"tokens": tokens}, sys.stdout)


if __name__ == "__main__":
    main()
