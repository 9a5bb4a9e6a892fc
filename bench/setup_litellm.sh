#!/usr/bin/env bash
# LiteLLM's proxy for bench/peers.py, in its own venv (.tools/litellm-venv), never in the project's venv.
# Idempotent; prints one line and exits 0 when it cannot install (the bench then skips LiteLLM).
set -uo pipefail
cd "$(dirname "$0")/.."
VERSION=1.108.7
venv=.tools/litellm-venv
stamp=$venv/.installed-$VERSION
[ -f "$stamp" ] && exit 0
mkdir -p .tools .cache
{ [ -x $venv/bin/python ] || python3 -m venv $venv; } &&
  $venv/bin/pip install --disable-pip-version-check -q "litellm[proxy]==$VERSION" > .cache/litellm-install.log 2>&1
if [ $? -eq 0 ]; then
  touch "$stamp"
else
  echo "bench: LiteLLM $VERSION could not be installed (see .cache/litellm-install.log); bench/peers.py skips it" >&2
fi
exit 0
