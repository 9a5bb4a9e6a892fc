#!/usr/bin/env bash
# Run the whole suite in the project venv, inside a loopback-only network namespace: the tests start
# real harness CLIs and SDK clients that name real provider hosts, and nothing may reach the internet.
# pytest's exit 5 (no tests collected) is a failure here too.
set -uo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/.tools/npm/node_modules/.bin:$PWD/.tools/apptainer/usr/bin:$PATH"
export HF_HUB_OFFLINE=1 POLAR_NETNS=1
if [ "$(id -u)" = 0 ]; then ns=(unshare -n); else ns=(unshare -rn); fi
"${ns[@]}" bash -c 'ip link set lo up && exec "$@"' _ .venv/bin/python -m pytest "$@"
rc=$?
if [ "$rc" -eq 5 ]; then echo "no tests were collected" >&2; exit 1; fi
exit "$rc"
