#!/usr/bin/env bash
# Run the suite in the project venv, inside a loopback-only network namespace: the tests start real harness
# CLIs and SDK clients that name real provider hosts, and nothing may reach the internet.
#
# With no arguments (`make test`): two runs at once.
# - The tests not marked `serial`: POLAR_TEST_WORKERS pytest-xdist workers (default 3: on 2 cores 3 keep the CPU
#   ~97 % busy, vmstat over a whole run, so more do not help), each test file on one worker (--dist loadfile: a
#   module's fixtures start once), at nice 10. xdist's own order (files with most tests first) spreads the few
#   files that take minutes over the run; started together (--no-loadscope-reorder with them first) they ran 9
#   samples at once and three of test_sample's ran past their 120 s budget.
# - The tests marked `serial` (timers a starved CPU would trip: node liveness, drains), one at a time beside the
#   parallel run, at normal priority: the kernel gives them the CPU whenever they want it. After the parallel run
#   they added 208 s; beside it the whole suite took 1490 s against 1528 s (one run each). Their output follows
#   the parallel run's.
# The slowest 30 tests of the parallel run are listed at its end.
# With arguments: plain pytest with them (add -n N yourself to run those in parallel).
# pytest's exit 5 (no tests collected) is a failure here too.
set -uo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/.tools/npm/node_modules/.bin:$PWD/.tools/apptainer/usr/bin:$PATH"
export HF_HUB_OFFLINE=1 POLAR_NETNS=1
if [ "$(id -u)" = 0 ]; then ns=(unshare -n); else ns=(unshare -rn); fi
pytest_at() {  # pytest_at NICENESS ARGS...
  local niceness=$1; shift
  "${ns[@]}" bash -c 'ip link set lo up && exec "$@"' _ nice -n "$niceness" .venv/bin/python -m pytest "$@"
}
pytest() { pytest_at 0 "$@"; }

if [ "$#" -gt 0 ]; then
  pytest "$@"
  rc=$?
  if [ "$rc" -eq 5 ]; then echo "no tests were collected" >&2; exit 1; fi
  exit "$rc"
fi

workers=${POLAR_TEST_WORKERS:-3}
start=$SECONDS serial_rc=0 serial_pid=
serial_log=$(mktemp -d)/serial
# Only when some test is marked serial: a run that selects none would end the output on "0 selected".
if grep -rqE 'mark\.serial\b' tests --include='*.py'; then
  # Its own --basetemp: two pytest sessions at once must not share (or clean up) one numbered temp folder.
  (pytest -m serial --durations=10 --basetemp="$serial_log.tmp" > "$serial_log.out" 2>&1
   serial_rc=$?; echo $((SECONDS - start)) > "$serial_log.s"; exit $serial_rc) &
  serial_pid=$!
  trap 'pkill -f -- "--basetemp=$serial_log.tmp"; exit 130' INT TERM  # an interrupted make test stops both
fi
pytest_at 10 -n "$workers" --dist loadfile -m "not serial" --durations=30
rc=$?
parallel_s=$((SECONDS - start))
if [ "$rc" -eq 5 ]; then echo "no tests were collected" >&2; rc=1; fi
serial_s=0
if [ -n "$serial_pid" ]; then
  wait "$serial_pid"
  serial_rc=$? serial_s=$(cat "$serial_log.s")
  cat "$serial_log.out"
  [ "$serial_rc" -eq 5 ] && serial_rc=0
fi
[ "$serial_rc" -ne 0 ] || rm -rf "$(dirname "$serial_log")"  # kept for a look when it failed
echo "test phases: parallel ($workers workers, nice 10) ${parallel_s} s, serial (alongside) ${serial_s} s," \
     "both $((SECONDS - start)) s"
[ "$rc" -ne 0 ] && exit "$rc"
exit "$serial_rc"
