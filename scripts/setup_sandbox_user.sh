#!/usr/bin/env bash
# The host identity every sandbox process runs as when Polar runs as root (issue 23): a system user
# `polar-sandbox` with its own group, no home, no shell, no password; it owns nothing outside a sample's folders.
# An unprivileged Polar needs none (its sandboxes run as the user who started it).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh

user=polar-sandbox
if getent passwd "$user" > /dev/null; then info "user $user exists (uid $(id -u "$user"))"; exit 0; fi
[ "$(id -u)" = 0 ] || { info "not root: sandboxes run as $(id -un); no $user user needed"; exit 0; }
useradd --system --user-group --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin \
  --comment "Polar sandboxes (unprivileged)" "$user" || die "could not create the $user user"
info "created user $user (uid $(id -u "$user"), gid $(id -g "$user"))"
