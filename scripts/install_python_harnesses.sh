#!/usr/bin/env bash
# The Python harnesses, each in its own venv .tools/<name>-venv (never the project's .venv, whose pins
# must not move), pinned twice: the harness's version below, and every dependency by
# scripts/harnesses/python/<name>.txt (written by the first install, like npm's lock). Each harness's
# command is linked into .tools/bin, which `polar run` puts on the harness's PATH (the venvs' own
# bin folders stay off it, so the harness's shell keeps the system python). Skipped per harness when its
# lock matches the venv's stamp; after an install the command must print its pinned version inside a
# loopback-only network namespace. Prints how long each harness and the whole step took, and its size.
# An agent framework (adapters/frameworks/) is a harness whose command is an example agent script: it is
# copied to .tools/frameworks (the sandbox shows .tools, not the checkout) and run by a wrapper in .tools/bin
# on its venv's python; the script is copied again on every run, so an edited example needs no reinstall.
set -euo pipefail
self=$(readlink -f "$0")
cd "$(dirname "$self")/.."
source scripts/lib.sh

# name | pip requirement | command (in the venv's bin) | version check argv after the command | python
#   [| agent script in adapters/frameworks/, for a framework: the command is then a wrapper running it]
HARNESSES=(
  "mini-swe-agent|mini-swe-agent==2.4.6|mini|--help|system"
  "aider|aider-chat==0.86.2|aider|--version|system"
  "hermes-agent|hermes-agent==0.19.0|hermes|--version|system"
  "openhands|openhands==1.16.0|openhands|--version|3.12"
  "openai-agents|openai-agents==0.24.0|polar-openai-agents|--help|system|openai_agents_handoff.py"
  "smolagents|smolagents[openai]==1.26.0|polar-smolagents|--help|system|smolagents_tool_calling.py"
  "langgraph|langgraph==1.2.22 langchain-openai==1.7.4|polar-langgraph|--help|system|langgraph_two_agents.py"
)
locks=scripts/harnesses/python
links=.tools/bin
mkdir -p "$locks" "$links"
# The system python: the bwrap sandbox shows /usr but not a pyenv or conda prefix a venv would point into.
py=/usr/bin/python3
need_venv "$py"
pyver=$("$py" -c 'import sys; print(sys.version.split()[0])')

offline=(unshare -n); [ "$(id -u)" = 0 ] || offline=(unshare -rn)
ip=$(PATH=$PATH:/usr/sbin:/sbin command -v ip) || die "ip (iproute2) missing"

stamp_of() { { echo "$2 python$3"; cat "$locks/$1.txt" 2>/dev/null; } | sha256sum | cut -c1-16; }

# OpenHands needs Python 3.12 exactly; Debian 12 has 3.11. A pyenv 3.12 (as on these machines) is copied to
# .tools/python3.12 with its libpython found relative to the binary, so that the sandbox, which shows .tools
# but not /root/.pyenv, can run it. Prints the interpreter, or nothing when there is none.
python312() {
  local dst=.tools/python3.12 src
  if [ ! -x "$dst/bin/python3.12" ]; then
    src=$(ls -d "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.12.* 2> /dev/null | sort -V | tail -n 1)
    [ -n "$src" ] && [ -x "$src/bin/python3.12" ] || return 0
    command -v patchelf > /dev/null || die "patchelf is needed to relocate $src (scripts/setup_apt.sh installs it)"
    rm -rf "$dst.tmp" && cp -a "$src" "$dst.tmp"
    patchelf --set-rpath '$ORIGIN/../lib' "$dst.tmp/bin/python3.12"
    mv "$dst.tmp" "$dst"
  fi
  "$dst/bin/python3.12" -c 'import venv, ensurepip' 2> /dev/null && echo "$PWD/$dst/bin/python3.12"
}

# The command of a harness: a link to its venv's own, or for a framework a wrapper running its agent script.
link_command() {
  local name=$1 cli=$2 script=$3 venv=.tools/$1-venv
  if [ -z "$script" ]; then ln -sfn "$PWD/$venv/bin/$cli" "$links/$cli"; return; fi
  mkdir -p .tools/frameworks
  cp "adapters/frameworks/$script" ".tools/frameworks/$script.tmp" && mv ".tools/frameworks/$script.tmp" ".tools/frameworks/$script"
  printf '#!/bin/sh\n# %s: adapters/frameworks/%s on its own venv (scripts/install_python_harnesses.sh)\nexec "%s" "%s" "$@"\n' \
    "$name" "$script" "$PWD/$venv/bin/python" "$PWD/.tools/frameworks/$script" > "$links/$cli.tmp"
  chmod +x "$links/$cli.tmp" && mv "$links/$cli.tmp" "$links/$cli"
}

install_one() {
  local name=$1 req=$2 cli=$3 check=$4 python=$5 script=${6:-}
  local venv=.tools/$name-venv lock=$locks/$name.txt start=$SECONDS py=$py pyver=$pyver
  if [ "$python" != system ]; then
    py=$(python312)
    [ -n "$py" ] || { info "$name: skipped, no Python $python here (it needs exactly that version)"; return 0; }
    pyver=$("$py" -c 'import sys; print(sys.version.split()[0])')
  fi
  local bin=$venv/bin/$cli; [ -z "$script" ] || bin=$venv/bin/python
  if [ -x "$bin" ] && [ -f "$lock" ] && [ "$(cat "$venv/.installed" 2>/dev/null)" = "$(stamp_of "$name" "$req" "$pyver")" ]; then
    link_command "$name" "$cli" "$script"
    info "$name: up to date ($venv)"; return 0
  fi
  rm -rf "$venv"
  "$py" -m venv "$venv"
  local pip=("$venv/bin/pip" install --disable-pip-version-check --no-input --quiet) log=.cache/pip-$name.log
  if [ -f "$lock" ]; then
    "${pip[@]}" -r "$lock" > "$log" 2>&1 || { tail -n 20 "$log" >&2; die "pip install $name (from $lock) failed (network or registry unreachable?)"; }
  else
    info "$name: no lock yet; installing $req and writing $lock"
    # shellcheck disable=SC2086  # a framework's requirement may name several packages
    "${pip[@]}" $req > "$log" 2>&1 || { tail -n 20 "$log" >&2; die "pip install $req failed (network or registry unreachable?)"; }
    "$venv/bin/pip" freeze --disable-pip-version-check --exclude-editable > "$lock.tmp" && mv "$lock.tmp" "$lock"
  fi
  for r in $req; do grep -qiF "${r/\[*\]/}" "$lock" || die "$lock does not pin $r"; done   # pip freeze drops [extras]
  link_command "$name" "$cli" "$script"
  local home=$PWD/.cache/harness-version-home-$name out
  rm -rf "$home" && mkdir -p "$home"
  out=$("${offline[@]}" env HOME="$home" LITELLM_LOCAL_MODEL_COST_MAP=True sh -c \
        '"$0" link set lo up && exec timeout 120 "$1" "$2"' "$ip" "$PWD/$links/$cli" "$check" 2>&1) \
    || die "$name: $cli $check failed offline: $(tail -n 5 <<< "$out")"
  rm -rf "$home"
  stamp_of "$name" "$req" "$pyver" > "$venv/.installed"
  info "$name ($req): $links/$cli, installed in $((SECONDS - start)) s, $(du -sh "$venv" | cut -f1)"
}

# All at once (each in its own venv; pip mostly waits on the network), each one's lines printed when it ends.
start=$SECONDS
pids=() names=()
for entry in "${HARNESSES[@]}"; do
  IFS='|' read -r name req cli check python script <<< "$entry"
  install_one "$name" "$req" "$cli" "$check" "$python" "$script" > ".cache/install-$name.log" 2>&1 &
  pids+=("$!") names+=("$name")
done
failed=()
for i in "${!pids[@]}"; do
  wait "${pids[$i]}" || failed+=("${names[$i]}")
  cat ".cache/install-${names[$i]}.log"
done
[ ${#failed[@]} -eq 0 ] || die "python harnesses failed: ${failed[*]}"
fresh=0
for name in "${names[@]}"; do grep -q ': up to date (' ".cache/install-$name.log" || fresh=$((fresh + 1)); done
[ "$fresh" -gt 0 ] || step_status skipped
info "python harnesses ready in $((SECONDS - start)) s"
