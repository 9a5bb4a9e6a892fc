# Shared helpers for the setup scripts.
POLAR_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
step() { printf '\n==> %s\n' "$*"; }
info() { printf '    %s\n' "$*"; }
die() { printf 'setup failed: %s\n' "$*" >&2; exit 1; }
# Run a command that needs the network; on failure say which step and why, not a traceback.
# The log path is absolute so that net also works from another working directory.
net() {
  local what=$1; shift
  if ! "$@" > "$POLAR_ROOT/.cache/net.log" 2>&1; then
    tail -n 20 "$POLAR_ROOT/.cache/net.log" >&2
    die "$what failed (network or registry unreachable?). Command: $*"
  fi
}
mkdir -p "$POLAR_ROOT/.cache"
