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
# Byte-compile a venv's packages once, after a `pip install --no-compile`. Python would compile on first import
# and cache the result, but not where PYTHONDONTWRITEBYTECODE is set (it is on these machines): then every
# process compiles torch and transformers afresh, ~9 s of CPU per reference server start (27 s -> 4 s
# measured), ~1 s per mitmdump. Files that are not Python 3 (test data in some packages) fail to compile and are
# left alone, hence `|| true`.
compile_venv() {
  local venv=$1 marker=$1/.polar-compiled
  [ -f "$marker" ] && return 0
  info "byte-compiling $venv (once)"
  env -u PYTHONDONTWRITEBYTECODE "$venv/bin/python" -m compileall -q -j 0 "$venv/lib" > /dev/null 2>&1 || true
  touch "$marker"
}
# The system python's venv module (the tool venvs under .tools are made with it): installed when missing.
need_venv() {
  local py=$1
  "$py" -c 'import venv, ensurepip' 2> /dev/null && return 0
  [ "$(id -u)" = 0 ] || die "$py with venv is needed (Debian: apt-get install python3-venv)"
  net "apt-get install python3-venv" apt-get install -y -q --no-install-recommends -o DPkg::Lock::Timeout=300 python3-venv
}
