"""Mistral's own reference, for the Mistral family tests (issue 45): mistral-common, run on its own venv through
tests/mistral_oracle.py, and its real Tekken tokenizer converted to a Hugging Face tokenizer directory with the
chat template mistral-common writes for it: what a Mistral model converted for Hugging Face ships."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PYTHON = ROOT / ".tools" / "mistral-common-venv" / "bin" / "python"
TEKKEN = "tekken_240911.json"  # Mistral NeMo's Tekken (131k ids), shipped in mistral-common's wheel


def mistral_common(chats: list[dict[str, Any]], version: str | None = None, tokenizer: str = TEKKEN,
                   export: Path | None = None) -> dict[str, Any]:
    """{"tokens", "texts"}: mistral-common's encoding of each OpenAI-shaped chat (tests/mistral_oracle.py), in the
    tokenizer's own format version or in `version` ("v7", "v11", "v13")."""
    assert PYTHON.is_file(), f"{PYTHON}: no mistral-common; run `make setup` (scripts/install_reference_libs.sh)"
    request = {"tokenizer": tokenizer, "version": version, "chats": chats, "export": str(export) if export else None}
    done = subprocess.run([str(PYTHON), str(ROOT / "tests" / "mistral_oracle.py")], capture_output=True, text=True,
                          input=json.dumps(request), timeout=300)
    assert done.returncode == 0, f"mistral_oracle.py failed:\n{done.stderr[-3000:]}"
    return json.loads(done.stdout)


def write_hf_tokenizer(out: Path, version: str | None = None, tokenizer: str = TEKKEN) -> Path:
    """The Tekken tokenizer (in format `version`, else its own) as a Hugging Face tokenizer directory (transformers'
    own converter), with mistral-common's chat template for it."""
    from transformers.integrations.mistral.tokenizer import convert_tekken_tokenizer

    source = out.with_name(out.name + "-tekken")
    mistral_common([], version, tokenizer, export=source)
    convert_tekken_tokenizer(str(source / "tekken.json")).save_pretrained(str(out))  # its sibling template
    return out
