#!/usr/bin/env bash
# `make test`: the whole setup (scripts/setup.sh all), then the suite (scripts/test.sh, arguments passed on),
# each timed. The last line says how long each phase took, also when the tests fail, so that a slowdown shows
# in every run; it goes to .cache/phases too, with the exit status (.ci/run reads both). Exits with setup's
# status when setup failed, else the suite's.
set -uo pipefail
cd "$(dirname "$0")/.."
t0=$SECONDS
bash scripts/setup.sh all
rc=$?
setup="setup $((SECONDS - t0)) s"
if [ "$rc" = 0 ]; then
  t1=$SECONDS
  bash scripts/test.sh "$@"
  rc=$?
  tests="tests $((SECONDS - t1)) s"
  [ "$rc" = 0 ] || tests+=" (exit $rc)"
else
  setup+=" (exit $rc)" tests="tests not run"
fi
line="phases: $setup, $tests, total $((SECONDS - t0)) s"
mkdir -p .cache
printf '%s\n%s\n' "$line" "$rc" > .cache/phases
printf '\n%s\n' "$line"
exit "$rc"
