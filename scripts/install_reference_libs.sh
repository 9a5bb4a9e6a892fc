#!/usr/bin/env bash
# The model families' own reference libraries, each in its own venv under .tools/ (issue 45): the oracles the
# family tests check Polar's prompts against. Never the project's .venv: their pins clash with it (mistral-common
# caps numpy below 2.4 on Python <= 3.12, and the project pins 2.4).
#   mistral-common (Mistral AI, Apache-2.0), .tools/mistral-common-venv: its wheel ships Mistral's real tokenizers
#     (Tekken, SentencePiece v1-v7); it encodes a chat request exactly as Mistral's models were trained on, and
#     writes the Hugging Face chat template a converted Mistral tokenizer carries.
#   llama-models (Meta; under the Llama Community Licenses its README names, used for tests only),
#     .tools/llama-models-venv: Llama 3's chat format (llama3/chat_format.py) and the Llama 3.1 vocabulary with
#     its tool tokens (<|python_tag|>, <|eom_id|>, the ipython role), on tiktoken.
# Each pinned twice: the version below and every dependency by scripts/locks/NAME.txt (written by the first
# install). A venv is skipped when its lock matches its stamp.
set -euo pipefail
self=$(readlink -f "$0")
cd "$(dirname "$self")/.."
source scripts/lib.sh

py=/usr/bin/python3  # the system python, as the other tool venvs (scripts/install_python_harnesses.sh)
need_venv "$py"

# install NAME REQUIREMENT MODULE: .tools/NAME-venv with REQUIREMENT, checked by importing MODULE
install() {
  local name=$1 req=$2 module=$3
  local venv=.tools/$name-venv lock=scripts/locks/$name.txt
  stamp_of() { { echo "$req $("$py" -c 'import sys; print(sys.version.split()[0])')"; cat "$lock" 2> /dev/null || true; } | sha256sum | cut -c1-16; }
  if [ -x "$venv/bin/python" ] && [ -f "$lock" ] && [ "$(cat "$venv/.installed" 2> /dev/null)" = "$(stamp_of)" ]; then
    up_to_date "$venv"; return 0
  fi
  rm -rf "$venv"
  "$py" -m venv "$venv"
  local pip=("$venv/bin/pip" install --disable-pip-version-check --no-input --quiet)
  if [ -f "$lock" ]; then
    net "pip install $name (from $lock)" "${pip[@]}" -r "$lock"
  else
    info "no lock yet: installing $req and writing $lock"
    net "pip install $req" "${pip[@]}" "$req"
    mkdir -p "$(dirname "$lock")"
    "$venv/bin/pip" freeze --disable-pip-version-check > "$lock.tmp" && mv "$lock.tmp" "$lock"
  fi
  sed 's/_/-/g' "$lock" | grep -qixF "$req" || die "$lock does not pin $req"  # pip writes llama_models==…
  "$venv/bin/python" -c "import $module" || die "$venv: $module does not import"
  stamp_of > "$venv/.installed"
  info "$req: $(du -sh "$venv" | cut -f1)"
}

install mistral-common mistral-common==1.13.1 mistral_common.tokens.tokenizers.mistral
install llama-models llama-models==0.3.0 llama_models.llama3.chat_format
