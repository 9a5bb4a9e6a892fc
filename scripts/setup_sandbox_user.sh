#!/usr/bin/env bash
# The host identity every sandbox process runs as when Polar runs as root (issue 23): a system user
# `polar-sandbox` with its own group, no home, no password (a locked account); it owns nothing outside a
# sample's folders. Its shell is /bin/sh, not nologin: tools in the sandbox (tmux, used by OpenHands) start the
# passwd shell for their panes. An unprivileged Polar needs none (its sandboxes run as the user who started it).
# It also gets a subordinate uid and gid range (/etc/subuid, /etc/subgid: 65536 ids past every range there):
# a container's root and the image's other users are those ids on the host (polar/sandbox/identity.py).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh

user=polar-sandbox
shell=/bin/sh
changed=0
if getent passwd "$user" > /dev/null; then
  if [ "$(getent passwd "$user" | cut -d: -f7)" != "$shell" ]; then
    [ "$(id -u)" = 0 ] || die "user $user has no $shell shell and we are not root to change it"
    usermod --shell "$shell" "$user"
  fi
  info "user $user exists (uid $(id -u "$user"))"
else
  [ "$(id -u)" = 0 ] || { info "not root: sandboxes run as $(id -un); no $user user needed"; step_status skipped; exit 0; }
  useradd --system --user-group --no-create-home --home-dir /nonexistent --shell "$shell" \
    --comment "Polar sandboxes (unprivileged)" "$user" || die "could not create the $user user"
  info "created user $user (uid $(id -u "$user"), gid $(id -g "$user"))"
  changed=1
fi
[ "$(id -u)" = 0 ] || { step_status skipped; exit 0; }
for file in /etc/subuid /etc/subgid; do
  touch "$file"
  if grep -q "^$user:" "$file"; then
    info "$file: $(grep "^$user:" "$file")"
    continue
  fi
  # past the end of every range there (and past 100000, where distributions start theirs)
  start=$(awk -F: 'BEGIN { end = 100000 } { if ($2 + $3 > end) end = $2 + $3 } END { print end }' "$file")
  echo "$user:$start:65536" >> "$file"
  info "$file: $user:$start:65536 added"
  changed=1
done
[ "$changed" = 1 ] || step_status skipped
