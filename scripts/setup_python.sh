#!/usr/bin/env bash
# Create .venv and install the package with its serve (torch), trl and test extras; skipped when setup.cfg has not changed.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh
stamp=.venv/.polar-installed
want=$(sha256sum setup.cfg pyproject.toml | sha256sum | cut -c1-16)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then info "up to date"; exit 0; fi
[ -x .venv/bin/python ] || python3 -m venv .venv
info "installing (torch CPU wheel from local disk, the rest from PyPI)"
net "pip install" .venv/bin/pip install --disable-pip-version-check -e '.[serve,test,trl]'
echo "$want" > "$stamp"
info "installed"
