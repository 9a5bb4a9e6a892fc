#!/usr/bin/env bash
# Build a tiny sandbox rootfs from Debian's busybox-static (~2 MB, <1 s): /bin holds busybox and one
# link per applet; /lib and /lib64 point into /usr, which is empty so that a caller may bind the
# host's /usr read-only over it (then /usr/bin/python3 and friends work inside).
# Usage: make_busybox_rootfs.sh [DIR]   (default .cache/rootfs/busybox; rebuilt only when busybox changed)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh

dest=${1:-.cache/rootfs/busybox}
bb=/bin/busybox
[ -x "$bb" ] || die "$bb missing (install busybox-static)"
if [ -x "$dest/bin/busybox" ] && cmp -s "$bb" "$dest/bin/busybox"; then info "rootfs up to date: $dest"; exit 0; fi

mkdir -p "$(dirname "$dest")"
tmp=$(mktemp -d "$(dirname "$dest")/.rootfs.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp"/{bin,etc,dev,proc,sys,tmp,root,home,run,usr,var/tmp,mnt,opt,srv}
chmod 1777 "$tmp/tmp" "$tmp/var/tmp"
ln -s usr/lib "$tmp/lib"
ln -s usr/lib64 "$tmp/lib64"
ln -s bin "$tmp/sbin"
cp "$bb" "$tmp/bin/busybox"
for applet in $("$bb" --list); do
  [ "$applet" = busybox ] || ln -s busybox "$tmp/bin/$applet"
done
printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n' > "$tmp/etc/passwd"
printf 'root:x:0:\nnogroup:x:65534:\n' > "$tmp/etc/group"
printf '127.0.0.1 localhost\n::1 localhost\n' > "$tmp/etc/hosts"
chmod 755 "$tmp"
rm -rf "$dest"
mv "$tmp" "$dest"
trap - EXIT
info "rootfs built: $dest ($(du -sh "$dest" | cut -f1))"
