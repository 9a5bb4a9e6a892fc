"""Mistral's own reference, for the Mistral family tests (issue 45): mistral-common, run on its own venv through
tests/mistral_oracle.py, and its real Tekken tokenizer converted to a Hugging Face tokenizer directory with the
chat template mistral-common writes for it: what a Mistral model converted for Hugging Face ships."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.reference_libs import run_oracle

TEKKEN = "tekken_240911.json"  # Mistral NeMo's Tekken (131k ids), shipped in mistral-common's wheel


def mistral_common(chats: list[dict[str, Any]], version: str | None = None, tokenizer: str = TEKKEN,
                   export: Path | None = None) -> dict[str, Any]:
    """{"tokens", "texts"}: mistral-common's encoding of each OpenAI-shaped chat (tests/mistral_oracle.py), in the
    tokenizer's own format version or in `version` ("v7", "v11", "v13")."""
    request = {"tokenizer": tokenizer, "version": version, "chats": chats, "export": str(export) if export else None}
    return run_oracle("mistral-common", "mistral_oracle.py", request)


def write_hf_tokenizer(out: Path, version: str | None = None, tokenizer: str = TEKKEN) -> Path:
    """The Tekken tokenizer (in format `version`, else its own) as a Hugging Face tokenizer directory (transformers'
    own converter), with mistral-common's chat template for it."""
    from transformers.integrations.mistral.tokenizer import convert_tekken_tokenizer

    source = out.with_name(out.name + "-tekken")
    mistral_common([], version, tokenizer, export=source)
    convert_tekken_tokenizer(str(source / "tekken.json")).save_pretrained(str(out))  # its sibling template
    return out
