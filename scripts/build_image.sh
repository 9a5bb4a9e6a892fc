#!/usr/bin/env bash
# The demo tasks' image, from Debian's packages (no container registry): mmdebstrap a minbase bookworm with
# python3, pytest, git and node's shared libraries from the machine's own apt sources, keep the extracted
# tree as an Apptainer *sandbox directory* (what rootless runs use: a rootless SIF needs /dev/fuse) and, with
# --sif, build a SIF from it (what root runs may use; the tests do; the demo does not, and skipping it spares
# the demo's setup mksquashfs, a CPU-bound minute or more on a busy 2-core machine). Cached: rebuilt only when
# the package list or this script changes (stamps .built for rootfs/, .built-sif for image.sif).
# Usage: build_image.sh [--sif] [DIR]   (default .cache/images/polar-tasks → DIR/rootfs/ and DIR/image.sif)
set -euo pipefail
self=$(readlink -f "$0")
cd "$(dirname "$self")/.."
source scripts/lib.sh

sif=0
[ "${1:-}" != --sif ] || { sif=1; shift; }
dest=${1:-.cache/images/polar-tasks}
suite=$(. /etc/os-release && echo "${VERSION_CODENAME:-bookworm}")
# libstdc++6: the host's node (bound in read-only for the harness CLIs) links it; bash/sed/grep come with minbase;
# tcc and libc6-dev: a small C compiler for the C tasks of fixtures/tbench (about 25 MB, gcc would be 200).
include=python3,python3-pytest,git,ca-certificates,libstdc++6,procps,tcc,libc6-dev
apptainer=$PWD/.tools/apptainer/usr/bin/apptainer
stamp_want="suite=$suite include=$include script=$(sha256sum "$self" | cut -c1-16)"

rootfs_built() { [ -d "$dest/rootfs/usr/bin" ] && [ "$(cat "$dest/.built" 2>/dev/null)" = "$stamp_want" ]; }
sif_built() { [ -f "$dest/image.sif" ] && [ "$(cat "$dest/.built-sif" 2>/dev/null)" = "$stamp_want" ]; }

build_rootfs() {
  [ -x "$apptainer" ] || die "$apptainer missing (scripts/install_apptainer.sh runs first)"
  [ "$(id -u)" = 0 ] || die "building the image needs root (mmdebstrap, apptainer build); or bring your own image"
  if ! command -v mmdebstrap > /dev/null; then
    info "installing mmdebstrap (apt)"
    net "apt-get install mmdebstrap" apt-get install -y -q --no-install-recommends -o DPkg::Lock::Timeout=300 mmdebstrap
  fi
  # The machine's own Debian archive for this release (no hard-coded host).
  local mirror tmp
  mirror=$(apt-get indextargets --format '$(REPO_URI) $(RELEASE)' 'Created-By: Packages' 2>/dev/null \
    | awk -v c="$suite" '$2 == c {print $1; exit}')
  [ -n "$mirror" ] || die "no Debian archive for $suite in the apt sources (apt-get indextargets)"
  mkdir -p "$(dirname "$dest")"
  tmp=$(mktemp -d "$(dirname "$dest")/.image.XXXXXX")
  trap "rm -rf '$tmp'" EXIT
  info "mmdebstrap $suite minbase + $include from $mirror (about 30 s)"
  net "mmdebstrap" mmdebstrap --variant=minbase --include="$include" "$suite" "$tmp/rootfs.tar" "$mirror"
  mkdir "$tmp/raw"
  tar -C "$tmp/raw" -xf "$tmp/rootfs.tar"
  rm "$tmp/rootfs.tar"
  # The sandbox directory needs Apptainer's /.singularity.d (instances need its action scripts). It does not
  # depend on the tree: take the one a sandbox build of an empty directory writes (a fraction of a second).
  mkdir "$tmp/empty"
  "$apptainer" -s build --sandbox "$tmp/meta" "$tmp/empty" > "$tmp/build.log" 2>&1 \
    || { tail -n 20 "$tmp/build.log" >&2; die "apptainer build --sandbox (for /.singularity.d) failed"; }
  cp -a "$tmp/meta/.singularity.d" "$tmp/raw/"
  rm -rf "$tmp/meta" "$tmp/empty" "$tmp/build.log"
  mv "$tmp/raw" "$tmp/rootfs"
  chmod 755 "$tmp/rootfs"
  "$apptainer" -s exec --containall --no-home --net --network none "$tmp/rootfs" python3 -c 'import pytest' \
    || die "the new image cannot import pytest"
  rm -rf "$dest"
  mv "$tmp" "$dest"
  chmod 755 "$dest"
  trap - EXIT
  echo "$stamp_want" > "$dest/.built"
  info "image: $dest/rootfs (sandbox dir, rootless)"
}

build_sif() {
  [ -x "$apptainer" ] || die "$apptainer missing (scripts/install_apptainer.sh runs first)"
  rm -f "$dest/.built-sif" "$dest/.image.sif.tmp"
  info "apptainer build image.sif from rootfs/ (about 20 s)"
  "$apptainer" -s build "$dest/.image.sif.tmp" "$dest/rootfs" > "$dest/.sif-build.log" 2>&1 \
    || { tail -n 20 "$dest/.sif-build.log" >&2; rm -f "$dest/.image.sif.tmp"; die "apptainer build failed"; }
  rm -f "$dest/.sif-build.log"
  mv "$dest/.image.sif.tmp" "$dest/image.sif"
  echo "$stamp_want" > "$dest/.built-sif"
  info "image: $dest/image.sif ($(du -sh "$dest/image.sif" | cut -f1))"
}

if rootfs_built && { [ "$sif" = 0 ] || sif_built; }; then up_to_date "$dest"; exit 0; fi
rootfs_built || build_rootfs
[ "$sif" = 0 ] || sif_built || build_sif
