"""Llama 3's own reference, for the Llama family tests (issue 45): llama-models, run on its own venv through
tests/llama_oracle.py, and the Llama 3.1 vocabulary it ships (tiktoken ranks) converted to a Hugging Face
tokenizer directory by transformers' own tiktoken converter, as Meta's Llama 3.1 checkpoints on the Hub were. The
directory has no chat template: the proxy renders a Llama 3.1 vocabulary with Polar's
polar_mitm/tokens/templates/llama3_tools.jinja."""
from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

from tests.reference_libs import run_oracle


def llama_models(chats: list[dict[str, Any]], export: Path | None = None) -> list[list[int]]:
    """The ids llama-models encodes each OpenAI-shaped chat ({"messages", "tools"}) into (tests/llama_oracle.py)."""
    request = {"chats": chats, "export": str(export) if export else None}
    return run_oracle("llama-models", "llama_oracle.py", request)["tokens"]


def write_hf_tokenizer(out: Path) -> Path:
    """llama-models' Llama 3.1 vocabulary as a Hugging Face tokenizer directory: <|begin_of_text|> as BOS,
    <|eot_id|> as EOS (as the instruct models' tokenizer_config.json has)."""
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    source = out.with_name(out.name + "-tiktoken")
    llama_models([], export=source)
    spec = json.loads((source / "llama3.json").read_text())

    class FromFile(TikTokenConverter):  # the ranks file read here: the project's venv has no tiktoken
        @staticmethod
        def load_tiktoken_bpe(path: str) -> dict[bytes, int]:
            lines = Path(path).read_text().splitlines()
            return {base64.b64decode(token): int(rank) for token, rank in (line.split() for line in lines if line)}

    specials = sorted(spec["special_tokens"], key=spec["special_tokens"].get)
    converted = FromFile(str(source / "tokenizer.model"), pattern=spec["pattern"],
                         extra_special_tokens=specials).converted()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=converted, bos_token="<|begin_of_text|>",
                                        eos_token="<|eot_id|>", pad_token="<|finetune_right_pad_id|>")
    tokenizer.save_pretrained(str(out))
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in specials}
    assert ids == spec["special_tokens"], "the converted vocabulary's special tokens are not llama-models' ids"
    return out
