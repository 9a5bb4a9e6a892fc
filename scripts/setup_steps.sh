# Running setup's steps (sourced by setup.sh after lib.sh): timed one by one, some branches at the same time,
# and a table of every step's time and result at the end. DRY_RUN=1 lists the steps instead of running them.
SETUP_TIMES=$POLAR_ROOT/.cache/setup-times.tsv
SETUP_LOGS=$POLAR_ROOT/.cache/setup-logs
DRY_RUN=${DRY_RUN:-0}
IN_BRANCH=0

now_us() { echo "${EPOCHREALTIME/./}"; }
tenths() { local d=$(( ($2 - $1) / 100000 )); echo "$((d / 10)).$((d % 10))"; }

# run_step NAME COMMAND...: a step, with its time and what it did (the script calls step_status; the default is
# installed) appended to the table. A failed step fails its branch.
run_step() {
  local name=$1; shift
  if [ "$DRY_RUN" = 1 ]; then
    printf '%s\t%s\t%s\n' "$([ "$IN_BRANCH" = 1 ] && echo parallel || echo serial)" "$name" "$*"; return 0
  fi
  step "$name"
  local status_file t0 rc=0 status
  status_file=$(mktemp "$POLAR_ROOT/.cache/step-status.XXXXXX")
  t0=$(now_us)
  POLAR_STEP_STATUS=$status_file "$@" || rc=$?
  status=$(cat "$status_file" 2> /dev/null); rm -f "$status_file"
  [ "$rc" = 0 ] || status="FAILED (exit $rc)"
  printf '%s\t%s\t%s\n' "$name" "$(tenths "$t0" "$(now_us)")" "${status:-installed}" >> "$SETUP_TIMES"
  return "$rc"
}

# parallel BRANCH...: each branch (a function running its steps in order) at the same time, its output kept in
# .cache/setup-logs/BRANCH.log and printed when it ends. Fails, once all have ended, when any failed.
parallel() {
  if [ "$DRY_RUN" = 1 ]; then local b; IN_BRANCH=1; for b; do "$b"; done; IN_BRANCH=0; return 0; fi
  mkdir -p "$SETUP_LOGS"
  local -A branch_of=()
  local b pid failed=()
  step "at the same time: $*"
  for b; do
    ( set -e; IN_BRANCH=1; "$b" ) > "$SETUP_LOGS/$b.log" 2>&1 &
    branch_of[$!]=$b
  done
  while [ ${#branch_of[@]} -gt 0 ]; do
    local rc=0
    wait -n -p pid "${!branch_of[@]}" || rc=$?
    b=${branch_of[$pid]}; unset "branch_of[$pid]"
    sed -e '/^$/d' -e "s/^/[$b] /" "$SETUP_LOGS/$b.log"
    [ "$rc" = 0 ] || failed+=("$b")
  done
  [ ${#failed[@]} -eq 0 ] || { printf 'setup failed: %s (logs: .cache/setup-logs/)\n' "${failed[*]}" >&2; return 1; }
}

times_begin() { [ "$DRY_RUN" = 1 ] || : > "$SETUP_TIMES"; SETUP_T0=$(now_us); }

# The table: every step's seconds and result, in the order they ended, then the wall time.
times_table() {
  [ "$DRY_RUN" = 1 ] && return 0
  step "setup times ($1)"
  printf '    %-52s %8s  %s\n' step seconds result
  awk -F'\t' '{printf "    %-52s %8s  %s\n", $1, $2, $3}' "$SETUP_TIMES"
  printf '    %-52s %8s\n' "total (wall clock; parallel steps overlap)" "$(tenths "$SETUP_T0" "$(now_us)")"
}
