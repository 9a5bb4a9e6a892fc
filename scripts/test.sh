#!/usr/bin/env bash
# Run the whole suite in the project venv. pytest's exit 5 (no tests collected) is a failure here too.
set -uo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/.tools/npm/bin:$PWD/.tools/apptainer/usr/bin:$PATH"
.venv/bin/python -m pytest "$@"
rc=$?
if [ "$rc" -eq 5 ]; then echo "no tests were collected" >&2; exit 1; fi
exit "$rc"
