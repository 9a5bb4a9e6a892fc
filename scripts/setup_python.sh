#!/usr/bin/env bash
# Create .venv and install the package with the extras asked for (default serve,test,trl: what the tests need;
# `make demo` asks for serve alone: the reference server's torch). Skipped when setup.cfg has not changed and
# the stamp lists every extra asked for (a full install serves the demo too).
# Usage: setup_python.sh [EXTRAS]   (comma-separated)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh
extras=${1:-serve,test,trl}
stamp=.venv/.polar-installed
want=$(sha256sum setup.cfg pyproject.toml | sha256sum | cut -c1-16)
read -r have have_extras 2> /dev/null < "$stamp" || true
covered() { local e; for e in ${extras//,/ }; do [[ ",${have_extras:-}," == *",$e,"* ]] || return 1; done; }
if [ "${have:-}" = "$want" ] && covered; then
  compile_venv .venv  # a venv installed before setup compiled its own
  up_to_date ".venv, extras ${have_extras}"; exit 0
fi
[ -x .venv/bin/python ] || python3 -m venv .venv
info "installing .[${extras}] (torch CPU wheel from local disk, the rest from PyPI)"
# --no-compile, then compile_venv: one parallel compileall over the venv (~33 s wall on 2 cores) instead of pip's
# file-by-file one, and done whatever PYTHONDONTWRITEBYTECODE says (scripts/lib.sh).
net "pip install" .venv/bin/pip install --disable-pip-version-check --no-compile -e ".[${extras}]"
rm -f .venv/.polar-compiled  # new packages: compile again
compile_venv .venv
# Extras installed earlier for the same setup.cfg stay installed (pip removes nothing): keep them listed.
[ "${have:-}" != "$want" ] || extras=$(tr ',' '\n' <<< "$have_extras,$extras" | sort -u | paste -sd, -)
echo "$want $extras" > "$stamp"
info "installed"
