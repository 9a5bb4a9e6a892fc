#!/usr/bin/env bash
# Install the Debian packages Polar's runtimes need, only those missing; `apt-get update` at most once.
# Usage: setup_apt.sh [demo|test]: what `make demo` needs, what only the tests add, or (no argument) both.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh

# libseccomp2 + libsqlite3-0: the relocated apptainer links them from the host; squashfs-tools: its SIF
# builds; mmdebstrap: the task image (build_image.sh); busybox-static: the sandbox check's root filesystem.
demo=(redis-server bubblewrap uidmap squashfs-tools squashfuse patchelf iproute2 util-linux
      busybox-static ca-certificates libseccomp2 libsqlite3-0 mmdebstrap)
# chromium (+ a font): the report tests open `polar report` pages headless.
# podman + runc: the docker runtime's engine (runc: crun refuses hybrid cgroups).
# python3-pytest: the demo tasks' verifier, run by the host's python3 in the bwrap and local runtimes (--image host).
# python3-venv: the Python harnesses' venvs (install_python_harnesses.sh).
test=(chromium fonts-dejavu-core python3-pytest podman runc python3-venv)
case ${1:-} in
  demo) packages=("${demo[@]}") ;;
  test) packages=("${test[@]}") ;;
  "") packages=("${demo[@]}" "${test[@]}") ;;
  *) die "setup_apt.sh: unknown layer '$1' (demo, test or none for both)" ;;
esac

installed() { [ "$(dpkg-query -W -f='${db:Status-Status}' "$1" 2>/dev/null)" = installed ]; }
has_candidate() { local c; c=$(apt-cache policy "$1" 2>/dev/null | awk '/Candidate:/ {print $2}'); [ -n "$c" ] && [ "$c" != "(none)" ]; }

missing=()
for p in "${packages[@]}"; do installed "$p" || missing+=("$p"); done
if [ ${#missing[@]} -eq 0 ]; then info "all present: ${packages[*]}"; step_status skipped; exit 0; fi
[ "$(id -u)" = 0 ] || die "missing Debian packages (${missing[*]}) and not root; install them with apt-get"

export DEBIAN_FRONTEND=noninteractive
updated=0
update() { info "apt-get update"; net "apt-get update" apt-get update -q -o DPkg::Lock::Timeout=300; updated=1; }
for p in "${missing[@]}"; do has_candidate "$p" || { update; break; }; done

info "installing: ${missing[*]}"
# Wait for another apt/dpkg run (other sessions share this machine) instead of failing on the lock.
install_cmd=(apt-get install -y -q --no-install-recommends -o DPkg::Lock::Timeout=300 "${missing[@]}")
if ! "${install_cmd[@]}" > .cache/apt.log 2>&1; then
  # Stale package lists give 404s: refresh once and retry.
  if [ "$updated" = 1 ]; then tail -n 20 .cache/apt.log >&2; die "apt-get install failed (network or mirror unreachable?)"; fi
  update
  net "apt-get install" "${install_cmd[@]}"
fi
for p in "${missing[@]}"; do installed "$p" || die "apt-get could not install $p"; done
info "installed"
