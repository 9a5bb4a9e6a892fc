#!/usr/bin/env bash
# The six harness CLIs, pinned by scripts/harnesses/package.json + package-lock.json, into the
# project-local prefix .tools/npm (never global). Binaries: .tools/npm/node_modules/.bin/<cli>, also
# reachable as .tools/npm/bin/<cli>. `install_harnesses.sh demo` installs only Pi and Codex (what `make demo`
# runs), from the lock cut down to them by scripts/npm_subset.py: the same versions, the same hashes; `all`
# (the default) installs the six. Skipped when the lock matches the stamp (.installed for the six,
# .installed-demo for the two); after an install each CLI must print its pinned version inside a
# loopback-only network namespace (they may try to phone home).
set -euo pipefail
self=$(readlink -f "$0")
cd "$(dirname "$self")/.."
source scripts/lib.sh

layer=${1:-all}
src=scripts/harnesses
dst=.tools/npm
declare -A pinned=([codex]=@openai/codex [claude]=@anthropic-ai/claude-code [qwen]=@qwen-code/qwen-code
                   [opencode]=opencode-ai [gemini]=@google/gemini-cli [pi]=@mariozechner/pi-coding-agent)
case $layer in
  demo) clis=(pi codex) ;;
  all) clis=(codex claude qwen opencode gemini pi) ;;
  *) die "install_harnesses.sh: unknown layer '$layer' (demo or all)" ;;
esac

command -v node > /dev/null && command -v npm > /dev/null || die "node and npm are needed (Node.js 20+)"
node_major=$(node -p 'process.versions.node.split(".")[0]')
[ "$node_major" -ge 20 ] || die "Node.js $(node --version) is too old for the harness CLIs (need 20+)"

stamp_of() { cat "$1/package.json" "$1/package-lock.json" 2>/dev/null | sha256sum | cut -c1-16 || true; }
installed() { [ -f "$1/package-lock.json" ] && [ "$(cat "$dst/$2" 2>/dev/null)" = "$(stamp_of "$1") node$node_major" ]; }
all_there() { local cli; for cli in "${clis[@]}"; do [ -x "$dst/node_modules/.bin/$cli" ] || return 1; done; }
# The six cover the demo's two; the demo's lock is cut from the six's, so it changes when theirs does.
lock=$src stamp=.installed
if [ "$layer" = demo ]; then
  lock=.cache/npm-demo
  rm -rf "$lock" && python3 scripts/npm_subset.py "$src" "$lock" "${pinned[pi]}" "${pinned[codex]}" \
    || die "could not cut Pi and Codex out of $src/package-lock.json"
  stamp=.installed-demo
  if installed "$src" .installed && all_there; then up_to_date "$dst, all six"; exit 0; fi
fi
if installed "$lock" "$stamp" && all_there; then up_to_date "$dst"; exit 0; fi

npm_flags=(--prefix "$dst" --no-audit --no-fund --loglevel=error)
# Fail fast when the registry is unreachable (npm itself retries each package for minutes).
net "npm registry check" timeout 60 npm ping --fetch-retries=0
mkdir -p "$dst"
rm -f "$dst/.installed" "$dst/.installed-demo"  # npm ci empties node_modules first
cp "$lock/package.json" "$dst/package.json"
start=$SECONDS
if [ -f "$lock/package-lock.json" ]; then
  cp "$lock/package-lock.json" "$dst/package-lock.json"
  info "npm ci ${clis[*]} (from $lock/package-lock.json; ~1.6 GB for the six, 0.55 GB for Pi and Codex)"
  if ! npm ci "${npm_flags[@]}" > .cache/npm.log 2>&1; then
    # A registry that lacks other platforms' optional binaries (opencode-darwin-*, …) yields a lock that
    # npm ci calls out of sync; npm install keeps every locked version and checks the same integrity hashes.
    grep -q 'code EUSAGE' .cache/npm.log || { tail -n 20 .cache/npm.log >&2; die "npm ci failed (network or registry unreachable?)"; }
    info "npm ci refused the lock (optional packages of other platforms missing); npm install with the lock"
    net "npm install" npm install "${npm_flags[@]}"
  fi
else
  rm -f "$dst/package-lock.json"
  info "npm install (no lock yet; writing scripts/harnesses/package-lock.json)"
  net "npm install" npm install "${npm_flags[@]}"
  cp "$dst/package-lock.json" "$src/package-lock.json"
fi
ln -sfn node_modules/.bin "$dst/bin"
# qwen-code vendors ripgrep without the execute bit; without it qwen falls back to a slower built-in grep.
find "$dst/node_modules/@qwen-code" -path '*/vendor/ripgrep/*/rg' -type f -exec chmod +x {} + 2>/dev/null || true
info "installed in $((SECONDS - start)) s"

# Each CLI's --version, with no network but loopback and a throwaway HOME.
offline=(unshare -n); [ "$(id -u)" = 0 ] || offline=(unshare -rn)
ip=$(PATH=$PATH:/usr/sbin:/sbin command -v ip) || die "ip (iproute2) missing"
home=$PWD/.cache/harness-version-home-npm
for cli in "${clis[@]}"; do
  version=$(node -p "require('./$src/package.json').dependencies['${pinned[$cli]}']")
  rm -rf "$home" && mkdir -p "$home"
  out=$("${offline[@]}" env HOME="$home" sh -c '"$0" link set lo up && exec timeout 60 "$1" --version' \
        "$ip" "$PWD/$dst/node_modules/.bin/$cli" 2>&1) || die "$cli --version failed offline: $out"
  grep -qF "$version" <<< "$out" || die "$cli reports '$out', expected $version"
  info "$cli $version: $dst/node_modules/.bin/$cli"
done
rm -rf "$home"
echo "$(stamp_of "$lock") node$node_major" > "$dst/$stamp"
