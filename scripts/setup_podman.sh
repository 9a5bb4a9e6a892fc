#!/usr/bin/env bash
# The container engine for `--runtime docker` (polar/sandbox/docker.py): Debian's podman with runc (setup_apt.sh
# installs both; crun refuses these VMs' hybrid cgroups), and the demo tasks' image imported from the cached
# root filesystem (build_image.sh; no registry) under the stable tag polar-tasks:local. Idempotent: the import
# (~13 s) happens once per rebuilt root filesystem; then this is a check and a tag (<1 s).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh

rootfs=.cache/images/polar-tasks/rootfs
command -v podman > /dev/null || die "podman missing (scripts/setup_apt.sh installs it)"
[ -d "$rootfs/usr/bin" ] || die "$rootfs missing (scripts/build_image.sh builds it)"
image_id() { podman image inspect --format '{{.Id}}' polar-tasks:local 2> /dev/null || true; }
before=$(image_id)
.venv/bin/python -m polar.sandbox.docker import "$rootfs" polar-tasks:local | sed 's/^/    /' \
  || die "could not import $rootfs into podman"
[ -z "$before" ] || [ "$(image_id)" != "$before" ] || step_status skipped  # the same image was there already
