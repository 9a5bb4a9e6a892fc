#!/usr/bin/env bash
# Run the suite in the project venv, inside a loopback-only network namespace: the tests start real harness
# CLIs and SDK clients that name real provider hosts, and nothing may reach the internet.
#
# With no arguments (`make test`): the whole suite in parallel, POLAR_TEST_WORKERS pytest-xdist workers
# (default 3: on 2 cores 3 keep the CPU ~97 % busy, vmstat over a whole run, so more do not help), each test file on
# one worker (--dist loadfile: a module's fixtures start once), then the tests marked `serial` (those that
# measure load or time) alone, one after another. The slowest 30 tests are listed at the end of the first run.
# With arguments: plain pytest with them (add -n N yourself to run those in parallel).
# pytest's exit 5 (no tests collected) is a failure here too.
set -uo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/.tools/npm/node_modules/.bin:$PWD/.tools/apptainer/usr/bin:$PATH"
export HF_HUB_OFFLINE=1 POLAR_NETNS=1
if [ "$(id -u)" = 0 ]; then ns=(unshare -n); else ns=(unshare -rn); fi
pytest() { "${ns[@]}" bash -c 'ip link set lo up && exec "$@"' _ .venv/bin/python -m pytest "$@"; }

if [ "$#" -gt 0 ]; then
  pytest "$@"
  rc=$?
  if [ "$rc" -eq 5 ]; then echo "no tests were collected" >&2; exit 1; fi
  exit "$rc"
fi

workers=${POLAR_TEST_WORKERS:-3}
start=$SECONDS
pytest -n "$workers" --dist loadfile -m "not serial" --durations=30
rc=$?
parallel_s=$((SECONDS - start))
if [ "$rc" -eq 5 ]; then echo "no tests were collected" >&2; rc=1; fi
start=$SECONDS serial_rc=0
# Only when some test is marked serial: a run that selects none would end the output on "0 selected".
if grep -rqE 'mark\.serial\b' tests --include='*.py'; then
  pytest -m serial --durations=10
  serial_rc=$?
  [ "$serial_rc" -eq 5 ] && serial_rc=0
fi
serial_s=$((SECONDS - start))
echo "test phases: parallel ($workers workers) ${parallel_s} s, serial ${serial_s} s"
[ "$rc" -ne 0 ] && exit "$rc"
exit "$serial_rc"
