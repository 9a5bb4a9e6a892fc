# Shared helpers for the setup scripts.
POLAR_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
step() { printf '\n==> %s\n' "$*"; }
info() { printf '    %s\n' "$*"; }
die() { printf 'setup failed: %s\n' "$*" >&2; exit 1; }
# What a step did, for setup.sh's time table (installed unless the script says otherwise): skipped, started, …
step_status() { [ -z "${POLAR_STEP_STATUS:-}" ] || echo "$1" > "$POLAR_STEP_STATUS"; }
up_to_date() { info "up to date ($*)"; step_status skipped; }
# Run a command that needs the network; on failure say which step and why, not a traceback.
# The log path is absolute so that net also works from another working directory; one log per script,
# since setup runs some scripts at the same time.
NET_LOG=$POLAR_ROOT/.cache/net-$(basename "$0" .sh).log
net() {
  local what=$1; shift
  if ! "$@" > "$NET_LOG" 2>&1; then
    tail -n 20 "$NET_LOG" >&2
    die "$what failed (network or registry unreachable?). Command: $*"
  fi
}
mkdir -p "$POLAR_ROOT/.cache"
