"""Mistral's reference encoding, run on mistral-common's own venv (scripts/install_mistral_common.sh), never the
project's: `.tools/mistral-common-venv/bin/python tests/mistral_oracle.py < REQUEST.json`.

The request: {"tokenizer": a file name in mistral_common/data (e.g. "tekken_240911.json"), "chats": [{"messages":
[…], "tools": […] or null}, …], "export": a folder or null} with messages and tools as the OpenAI Chat API takes
them. The answer, as JSON on stdout: {"tokens": [the ids mistral-common encodes each chat into], "texts": […]}.
With "export": the folder gets that Tekken tokenizer as tekken.json, its special tokens written out (older files
leave them to mistral-common's defaults), and chat_template.jinja, the Hugging Face chat template mistral-common
writes for it: what a Mistral model converted for Hugging Face carries. Imports only mistral_common and the
standard library."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import mistral_common
from mistral_common.integrations.chat_templates.chat_templates import convert_tokenizer_to_chat_template
from mistral_common.protocol.instruct.request import ChatCompletionRequest
from mistral_common.tokens.tokenizers.mistral import MistralTokenizer
from mistral_common.tokens.tokenizers.tekken import Tekkenizer


def main() -> None:
    request = json.load(sys.stdin)
    path = Path(mistral_common.__file__).parent / "data" / request["tokenizer"]
    tokenizer = MistralTokenizer.from_file(str(path))
    if request.get("export"):
        export(path, Path(request["export"]))
    tokens, texts = [], []
    for chat in request["chats"]:
        encoded = tokenizer.encode_chat_completion(ChatCompletionRequest.from_openai(chat["messages"], chat.get("tools")))
        tokens.append(encoded.tokens)
        texts.append(encoded.text)
    json.dump({"tokens": tokens, "texts": texts}, sys.stdout)


def export(path: Path, folder: Path) -> None:
    raw = json.loads(path.read_text())
    if "special_tokens" not in raw:
        raw["special_tokens"] = [{**t, "token_str": str(getattr(t["token_str"], "value", t["token_str"]))}
                                 for t in Tekkenizer.DEPRECATED_SPECIAL_TOKENS]
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tekken.json").write_text(json.dumps(raw))
    (folder / "chat_template.jinja").write_text(convert_tokenizer_to_chat_template(str(path)))


if __name__ == "__main__":
    main()
