#!/usr/bin/env bash
# The six harness CLIs, pinned by scripts/harnesses/package.json + package-lock.json, into the
# project-local prefix .tools/npm (never global). Binaries: .tools/npm/node_modules/.bin/<cli>, also
# reachable as .tools/npm/bin/<cli>. Skipped when the lock matches the stamp; after an install each CLI
# must print its pinned version inside a loopback-only network namespace (they may try to phone home).
set -euo pipefail
self=$(readlink -f "$0")
cd "$(dirname "$self")/.."
source scripts/lib.sh

src=scripts/harnesses
dst=.tools/npm
declare -A pinned=([codex]=@openai/codex [claude]=@anthropic-ai/claude-code [qwen]=@qwen-code/qwen-code
                   [opencode]=opencode-ai [gemini]=@google/gemini-cli [pi]=@mariozechner/pi-coding-agent)

command -v node > /dev/null && command -v npm > /dev/null || die "node and npm are needed (Node.js 20+)"
node_major=$(node -p 'process.versions.node.split(".")[0]')
[ "$node_major" -ge 20 ] || die "Node.js $(node --version) is too old for the harness CLIs (need 20+)"

stamp_of() { cat "$src/package.json" "$src/package-lock.json" 2>/dev/null | sha256sum | cut -c1-16 || true; }
want="$(stamp_of) node$node_major"
if [ -f "$src/package-lock.json" ] && [ -x "$dst/bin/pi" ] && [ "$(cat "$dst/.installed" 2>/dev/null)" = "$want" ]; then
  info "up to date ($dst)"; exit 0
fi

npm_flags=(--prefix "$dst" --no-audit --no-fund --loglevel=error)
# Fail fast when the registry is unreachable (npm itself retries each package for minutes).
net "npm registry check" timeout 60 npm ping --fetch-retries=0
mkdir -p "$dst"
cp "$src/package.json" "$dst/package.json"
start=$SECONDS
if [ -f "$src/package-lock.json" ]; then
  cp "$src/package-lock.json" "$dst/package-lock.json"
  info "npm ci (from scripts/harnesses/package-lock.json; ~1.6 GB, about a minute)"
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
home=$PWD/.cache/harness-version-home
for cli in codex claude qwen opencode gemini pi; do
  version=$(node -p "require('./$src/package.json').dependencies['${pinned[$cli]}']")
  rm -rf "$home" && mkdir -p "$home"
  out=$("${offline[@]}" env HOME="$home" sh -c '"$0" link set lo up && exec timeout 60 "$1" --version' \
        "$ip" "$PWD/$dst/node_modules/.bin/$cli" 2>&1) || die "$cli --version failed offline: $out"
  grep -qF "$version" <<< "$out" || die "$cli reports '$out', expected $version"
  info "$cli $version: $dst/node_modules/.bin/$cli"
done
rm -rf "$home"
echo "$(stamp_of) node$node_major" > "$dst/.installed"
