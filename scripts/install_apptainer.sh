#!/usr/bin/env bash
# Relocated Apptainer under .tools/apptainer (docs/design.md §6). Bookworm has no apptainer package, so the
# .deb comes from sid; on glibc < 2.38 it gets a private glibc from trixie (patchelf interpreter+rpath).
# Binaries: .tools/apptainer/usr/bin/apptainer and singularity -> apptainer. Idempotent (stamp file);
# always ends by running a busybox sandbox with --net --network none, as root and as an unprivileged user.
set -euo pipefail
self=$(readlink -f "$0")
cd "$(dirname "$self")/.."
source scripts/lib.sh

P=$PWD/.tools/apptainer
W=$PWD/.cache/apptainer-dl
want_apptainer=${APPTAINER_VERSION:-1.4.5-2}
glibc_series=2.41
keyring=/usr/share/keyrings/debian-archive-keyring.gpg
rootfs=.cache/rootfs/busybox

host_glibc=$(getconf GNU_LIBC_VERSION | awk '{print $2}')
needs_glibc() { [ "$(printf '%s\n2.38\n' "$host_glibc" | sort -V | head -n1)" != 2.38 ]; }

# The Debian archive URI the machine's own apt sources use for its release (no hard-coded host).
debian_mirror() {
  local codename
  codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
  apt-get indextargets --format '$(REPO_URI) $(RELEASE)' 'Created-By: Packages' 2>/dev/null \
    | awk -v c="$codename" '$2 == c {print $1; exit}'
}

apt_opts=()
fetch_lists() {
  local mirror
  mirror=$(debian_mirror)
  [ -n "$mirror" ] || die "no Debian archive for this release found in the apt sources (apt-get indextargets)"
  [ -r "$keyring" ] || die "$keyring missing (install debian-archive-keyring)"
  mkdir -p "$W/lists/partial" "$W/cache/archives/partial" "$W/debs"
  printf 'deb [signed-by=%s] %s %s main\n' "$keyring" "$mirror" trixie "$keyring" "$mirror" sid > "$W/sources.list"
  apt_opts=(-q "-oDir::Etc::sourcelist=$W/sources.list" -oDir::Etc::sourceparts=- "-oDir::State::Lists=$W/lists"
            "-oDir::Cache=$W/cache" -oAcquire::Languages=none -oAPT::Sandbox::User=root)
  info "package lists for trixie+sid from $mirror (private lists dir .cache/apptainer-dl/lists)"
  net "apt-get update (trixie+sid)" apt-get "${apt_opts[@]}" update
  # apt-get update only warns when a fetch fails: no lists at all means no network.
  compgen -G "$W/lists/*_Packages*" > /dev/null || { tail -n 5 "$NET_LOG" >&2
    die "could not fetch the trixie/sid package lists from $mirror (network unreachable?)"; }
}

# pick_version PKG PATTERN PREFERRED: PREFERRED when listed, else the newest version matching PATTERN.
pick_version() {
  local versions
  versions=$(apt-cache "${apt_opts[@]}" madison "$1" | awk -F' [|] ' '{gsub(/ /, "", $2); print $2}' | grep -E "$2" || true)
  [ -n "$versions" ] || die "no $1 version matching '$2' in trixie/sid"
  if grep -qxF "$3" <<< "$versions"; then echo "$3"; else sort -V <<< "$versions" | tail -n1; fi
}

download() {  # download PKG=VERSION... into $W/debs, those not there yet (apt-get download writes to the cwd)
  local want=() spec
  for spec in "$@"; do
    compgen -G "$W/debs/${spec%%=*}_${spec#*=}_*.deb" > /dev/null || want+=("$spec")
  done
  [ ${#want[@]} -eq 0 ] && return
  info "downloading ${want[*]}"
  (cd "$W/debs" && net "apt-get download ${want[*]}" apt-get "${apt_opts[@]}" download "${want[@]}")
}

# lay_out STAGE APPTAINER_DEB [LIBC_DEB]: build the relocated tree in STAGE; its paths point at $P.
lay_out() {
  local stage=$1 x=$W/x
  rm -rf "$x" "$stage" && mkdir -p "$x/a" "$stage/usr/etc" "$stage/usr/var"
  dpkg-deb -x "$2" "$x/a"
  cp -a "$x/a/usr/." "$stage/usr/"
  cp -a "$x/a/etc/." "$stage/usr/etc/"
  cp -a "$x/a/var/." "$stage/usr/var/"
  ln -s ../var "$stage/usr/lib/var"
  ln -s ../etc "$stage/usr/lib/etc"
  ln -sf apptainer "$stage/usr/bin/singularity"
  if [ -n "${3:-}" ]; then
    local G=usr/lib/apptainer-glibc
    mkdir -p "$x/c" "$stage/$G"
    dpkg-deb -x "$3" "$x/c"
    find "$x/c/usr/lib/x86_64-linux-gnu" -maxdepth 1 -name '*.so*' -exec cp -L {} "$stage/$G/" \;
    for bin in usr/bin/apptainer usr/lib/x86_64-linux-gnu/apptainer/bin/starter; do
      patchelf --set-interpreter "$P/$G/ld-linux-x86-64.so.2" --force-rpath --set-rpath "$P/$G" "$stage/$bin"
    done
  fi
  # Root on these VMs lacks CAP_SYS_RESOURCE; apptainer's default of full capabilities for root fails.
  sed -i 's/^root default capabilities = .*/root default capabilities = no/' "$stage/usr/etc/apptainer/apptainer.conf"
  grep -q '^root default capabilities = no$' "$stage/usr/etc/apptainer/apptainer.conf" \
    || die "could not set 'root default capabilities = no' in apptainer.conf"
  rm -rf "$x"
}

install_relocated() {
  fetch_lists
  local av lv="" debs
  av=$(pick_version apptainer '.' "$want_apptainer")
  [ "$av" = "$want_apptainer" ] || info "apptainer $want_apptainer not in sid any more; taking $av"
  debs=("apptainer=$av")
  if needs_glibc; then
    command -v patchelf > /dev/null || die "patchelf missing (run scripts/setup_apt.sh)"
    lv=$(pick_version libc6 "^${glibc_series//./\\.}-" none)
    debs+=("libc6=$lv")
    info "host glibc $host_glibc < 2.38: private glibc $lv for apptainer"
  fi
  download "${debs[@]}"
  local libc_deb=""
  [ -z "$lv" ] || libc_deb=$(ls "$W/debs/libc6_${lv}_"*.deb)
  lay_out "$P.new" "$(ls "$W/debs/apptainer_${av}_"*.deb)" "$libc_deb"
  rm -rf "$P" && mv "$P.new" "$P"
  echo "$stamp_want" > "$P/.installed"
}

check_exec() {  # check_exec [RUNNER...]: run the busybox sandbox, network none, via RUNNER
  local out
  out=$("$@" "$P/usr/bin/apptainer" -s exec --containall --no-home --net --network none "$PWD/$rootfs" \
        /bin/sh -c 'echo ok; ip -o link | cut -d: -f2 | tr -d " \n"' 2>&1) || { echo "$out"; return 1; }
  [ "$out" = $'ok\nlo' ] || { echo "$out"; return 1; }  # only the loopback interface inside
}

# Reinstall when the wanted version, the prefix, the host glibc or this script changes.
stamp_want="apptainer=$want_apptainer prefix=$P glibc=$host_glibc script=$(sha256sum "$self" | cut -c1-16)"
if [ -x "$P/usr/bin/apptainer" ] && [ "$(cat "$P/.installed" 2>/dev/null)" = "$stamp_want" ]; then
  up_to_date "$P"
else
  install_relocated
fi

version=$("$P/usr/bin/apptainer" --version) || die "$P/usr/bin/apptainer does not run"
info "$version at .tools/apptainer/usr/bin/apptainer"
bash scripts/make_busybox_rootfs.sh "$rootfs"
out=$(check_exec) || die "apptainer exec of $rootfs failed as $(id -un): $out"
info "exec with --net --network none works as $(id -un)"
if [ "$(id -u)" = 0 ]; then
  if out=$(check_exec setpriv --reuid=nobody --regid=nogroup --clear-groups env HOME=/tmp); then
    info "exec works rootless (as nobody, user namespaces)"
  else
    info "WARNING: rootless apptainer exec failed (as nobody): $out"
  fi
fi
