# Shared helpers for the setup scripts.
step() { printf '\n==> %s\n' "$*"; }
info() { printf '    %s\n' "$*"; }
die() { printf 'setup failed: %s\n' "$*" >&2; exit 1; }
# Run a command that needs the network; on failure say which step and why, not a traceback.
net() {
  local what=$1; shift
  if ! "$@" > .cache/net.log 2>&1; then
    tail -n 20 .cache/net.log >&2
    die "$what failed (network or registry unreachable?). Command: $*"
  fi
}
mkdir -p .cache
