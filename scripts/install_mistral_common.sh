#!/usr/bin/env bash
# mistral-common (Mistral AI's own tokenizer library, Apache-2.0) in its own venv, .tools/mistral-common-venv:
# the Mistral family's reference for the tests (issue 45). Its wheel ships Mistral's real tokenizers (Tekken,
# SentencePiece v1-v7); it encodes a chat request exactly as Mistral's models were trained on, and it writes the
# Hugging Face chat template a converted Mistral tokenizer carries. Never the project's .venv: it caps numpy
# below 2.4 on Python <= 3.12, and the project pins 2.4. Pinned twice: the version below and every dependency by
# scripts/locks/mistral-common.txt (written by the first install). Skipped when the lock matches the stamp.
set -euo pipefail
self=$(readlink -f "$0")
cd "$(dirname "$self")/.."
source scripts/lib.sh

req=mistral-common==1.13.1
venv=.tools/mistral-common-venv
lock=scripts/locks/mistral-common.txt
py=/usr/bin/python3  # the system python, as the other tool venvs (scripts/install_python_harnesses.sh)
need_venv "$py"
stamp_of() { { echo "$req $("$py" -c 'import sys; print(sys.version.split()[0])')"; cat "$lock" 2> /dev/null || true; } | sha256sum | cut -c1-16; }
if [ -x "$venv/bin/python" ] && [ -f "$lock" ] && [ "$(cat "$venv/.installed" 2> /dev/null)" = "$(stamp_of)" ]; then
  up_to_date "$venv"; exit 0
fi
rm -rf "$venv"
"$py" -m venv "$venv"
pip=("$venv/bin/pip" install --disable-pip-version-check --no-input --quiet)
if [ -f "$lock" ]; then
  net "pip install mistral-common (from $lock)" "${pip[@]}" -r "$lock"
else
  info "no lock yet: installing $req and writing $lock"
  net "pip install $req" "${pip[@]}" "$req"
  mkdir -p "$(dirname "$lock")"
  "$venv/bin/pip" freeze --disable-pip-version-check > "$lock.tmp" && mv "$lock.tmp" "$lock"
fi
grep -qiE "^mistral[-_]common==${req#*==}$" "$lock" || die "$lock does not pin $req"
"$venv/bin/python" -c 'import mistral_common.tokens.tokenizers.mistral' || die "$venv: mistral_common does not import"
stamp_of > "$venv/.installed"
info "$req: $(du -sh "$venv" | cut -f1)"
