"""gpt-oss's own renderer, openai-harmony (Apache-2.0, the `test` extra), as an oracle for Polar's harmony
template. openai-harmony fetches its vocabulary (o200k_base.tiktoken) from the internet; the same vocabulary is
the gpt-oss tokenizer's (o200k_harmony is o200k_base plus harmony's special tokens), so it is written here from
the tokenizer.json fetched at setup, byte for byte (its sha256 is the published file's, checked), and
openai-harmony reads it from disk (TIKTOKEN_ENCODINGS_BASE).

Conversations come in the shape HF chat templates take (OpenAI Chat messages, tools as functions) and are mapped
to harmony the way polar_mitm/tokens/templates/harmony.jinja documents: leading system messages are the developer
instructions, a later one a developer message, reasoning the analysis channel, a call a commentary message to
functions.NAME, a result a message from functions.NAME."""
from __future__ import annotations

import base64
import hashlib
import json
import os
import tempfile
from functools import cache
from pathlib import Path
from typing import Any

O200K_BASE_SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"  # openai-harmony's own pin


def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet, reversed: the character a tokenizer.json vocabulary writes for each byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = dict(zip(printable, printable)), 0
    for b in range(256):
        if b not in chars:
            chars[b], extra = 256 + extra, extra + 1
    return {chr(c): b for b, c in chars.items()}


def write_o200k_base(tokenizer_json: Path, out_dir: Path) -> Path:
    """o200k_base.tiktoken (base64 token, rank per line) from the gpt-oss tokenizer's BPE vocabulary."""
    vocab = json.loads(tokenizer_json.read_text())["model"]["vocab"]
    decode = _byte_decoder()
    lines = (f"{base64.b64encode(bytes(decode[c] for c in token)).decode()} {rank}\n"
             for token, rank in sorted(vocab.items(), key=lambda kv: kv[1]))
    data = "".join(lines).encode()
    digest = hashlib.sha256(data).hexdigest()
    assert digest == O200K_BASE_SHA256, f"o200k_base from {tokenizer_json}: sha256 {digest}, not the published file's"
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "o200k_base.tiktoken").write_bytes(data)
    return out_dir


_VOCAB = tempfile.TemporaryDirectory(prefix="polar-o200k-")  # removed when the process ends


@cache
def encoding(tokenizer_dir: Path) -> Any:
    """openai-harmony's gpt-oss encoding over the vocabulary of `tokenizer_dir`, written once per process."""
    vocab_dir = write_o200k_base(tokenizer_dir / "tokenizer.json", Path(_VOCAB.name))
    os.environ["TIKTOKEN_ENCODINGS_BASE"] = str(vocab_dir)  # read from disk: never the network
    from openai_harmony import HarmonyEncodingName, load_harmony_encoding

    return load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)


def _text(content: Any) -> str:
    return content if isinstance(content, str) else "".join(p.get("text", "") for p in content or [])


def harmony_ids(enc: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> list[int]:
    """openai-harmony's prompt for the conversation, ending where the assistant is to write."""
    from openai_harmony import (Author, Conversation, DeveloperContent, Message, Role, SystemContent,
                                ToolDescription)

    start = 0
    while start < len(messages) and messages[start]["role"] in ("system", "developer"):
        start += 1
    instructions = "\n\n".join(_text(m["content"]) for m in messages[:start])
    out = [Message.from_role_and_content(Role.SYSTEM, SystemContent.new())]
    if instructions or tools:
        dev = DeveloperContent.new()
        if instructions:
            dev = dev.with_instructions(instructions)
        if tools:
            dev = dev.with_function_tools([ToolDescription.new(
                t["function"]["name"], t["function"].get("description") or "",
                parameters=t["function"].get("parameters")) for t in tools])
        out.append(Message.from_role_and_content(Role.DEVELOPER, dev))
    names: dict[str, str] = {}
    for m in messages[start:]:
        role = m["role"]
        if role in ("system", "developer"):
            out.append(Message.from_role_and_content(
                Role.DEVELOPER, DeveloperContent.new().with_instructions(_text(m["content"]))))
        elif role == "user":
            out.append(Message.from_role_and_content(Role.USER, _text(m["content"])))
        elif role == "assistant":
            calls = m.get("tool_calls") or []
            if m.get("reasoning_content"):
                out.append(Message.from_role_and_content(Role.ASSISTANT, m["reasoning_content"]).with_channel("analysis"))
            if m.get("content"):
                out.append(Message.from_role_and_content(Role.ASSISTANT, _text(m["content"])).with_channel(
                    "commentary" if calls else "final"))
            for call in calls:
                fn = call["function"]
                names[call.get("id", "")] = fn["name"]
                args = fn["arguments"] if isinstance(fn["arguments"], str) else json.dumps(
                    fn["arguments"], ensure_ascii=False)
                out.append(Message.from_role_and_content(Role.ASSISTANT, args).with_channel("commentary")
                           .with_recipient(f"functions.{fn['name']}").with_content_type("<|constrain|>json"))
        elif role == "tool":
            name = m.get("name") or names.get(m.get("tool_call_id", ""), "unknown")
            author = Author.new(Role.TOOL, f"functions.{name}")
            out.append(Message.from_author_and_content(author, _text(m["content"]))
                       .with_recipient("assistant").with_channel("commentary"))
    return list(enc.render_conversation_for_completion(Conversation.from_messages(out), Role.ASSISTANT))
