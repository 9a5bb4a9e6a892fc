"""Mistral's reference encoding, run on mistral-common's own venv (scripts/install_reference_libs.sh), never the
project's: `.tools/mistral-common-venv/bin/python tests/mistral_oracle.py < REQUEST.json`.

The request: {"tokenizer": a file name in mistral_common/data (e.g. "tekken_240911.json"), "version": a format
version to encode with instead of the file's ("v7", "v11", "v13"; the later versions' tokens, [ARGS] and
[CALL_ID], then [THINK] and [/THINK], are added where Mistral's later Tekken files have them) or null,
"chats": [{"messages": […], "tools": […] or null}, …], "export": a folder or null} with messages and tools as the
OpenAI Chat API takes them. The answer, as JSON on stdout: {"tokens": [the ids mistral-common encodes each chat
into], "texts": […]}.
With "export": the folder gets that Tekken tokenizer as tekken.json, its special tokens written out (older files
leave them to mistral-common's defaults), and chat_template.jinja, the Hugging Face chat template mistral-common
writes for it: what a Mistral model converted for Hugging Face carries. Imports only mistral_common and the
standard library."""
from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import mistral_common
from mistral_common.integrations.chat_templates.chat_templates import convert_tokenizer_to_chat_template
from mistral_common.protocol.instruct.request import ChatCompletionRequest
from mistral_common.tokens.tokenizers.mistral import MistralTokenizer
from mistral_common.tokens.tokenizers.tekken import Tekkenizer


# Where Mistral's later Tekken files put the tokens of the v11+ formats (the shipped v3 file has fillers there):
# calls with [ARGS] and [CALL_ID] from v11 (Devstral), reasoning in [THINK] from v13 (Magistral).
LATER_SPECIALS = {"v11": {32: "[ARGS]", 33: "[CALL_ID]"},
                  "v13": {32: "[ARGS]", 33: "[CALL_ID]", 34: "[THINK]", 35: "[/THINK]"}}


def main() -> None:
    request = json.load(sys.stdin)
    path = Path(mistral_common.__file__).parent / "data" / request["tokenizer"]
    with tempfile.TemporaryDirectory(prefix="polar-tekken-") as scratch:  # the folder, when none is asked for
        tekken = export(path, request.get("version"), Path(request["export"] or scratch))
        tokenizer = MistralTokenizer.from_file(str(tekken))
    tokens, texts = [], []
    for chat in request["chats"]:
        encoded = tokenizer.encode_chat_completion(ChatCompletionRequest.from_openai(chat["messages"], chat.get("tools")))
        tokens.append(encoded.tokens)
        texts.append(encoded.text)
    json.dump({"tokens": tokens, "texts": texts}, sys.stdout)


def export(path: Path, version: str | None, folder: Path) -> Path:
    """`folder`/tekken.json: the file with its special tokens written out (older files leave them to mistral-common's
    defaults) and, for another format `version`, that version and its tokens; and `folder`/chat_template.jinja."""
    raw = json.loads(path.read_text())
    specials = raw.get("special_tokens") or [{**t, "token_str": str(getattr(t["token_str"], "value", t["token_str"]))}
                                             for t in Tekkenizer.DEPRECATED_SPECIAL_TOKENS]
    if version:
        raw["config"]["version"] = version
    later = LATER_SPECIALS.get(version or "", {})
    for rank in range(len(specials), max(later, default=-1) + 1):
        specials.append({"rank": rank, "token_str": later.get(rank, f"<SPECIAL_{rank}>"), "is_control": True})
    raw["special_tokens"] = specials
    folder.mkdir(parents=True, exist_ok=True)
    tekken = folder / "tekken.json"
    tekken.write_text(json.dumps(raw))
    (folder / "chat_template.jinja").write_text(convert_tokenizer_to_chat_template(str(tekken)))
    return tekken


if __name__ == "__main__":
    main()
