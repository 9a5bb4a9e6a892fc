"""Who a sandbox process is on the host (issue 23, docs/design.md §10): never the host's uid 0.

Polar started by root runs every sandbox process as the unprivileged `polar-sandbox` user that `make setup`
creates (scripts/setup_sandbox_user.sh): the runtimes drop to it (bwrap: `setpriv` as the sandbox's first
process; Apptainer: `--security uid:…,gid:…`), and the sample's HOME, workspace and socket folder are handed
to it before each exec. Polar started by an unprivileged user needs none of this: its sandboxes are that user.

Root inside, never outside (issue 66): under podman a container's processes run as the image's own user, root
unless its USER says otherwise, in a user namespace that starts at polar-sandbox's subordinate ids
(/etc/subuid, /etc/subgid; `subordinate_range`): the host sees the container's root as the first of them, an
unprivileged uid that owns nothing outside the sample's folders.

After each exec the host clears setuid/setgid bits in those folders, and copies out of a sandbox never carry
them: no file the agent made can gain privileges on the host. Both walks go by directory descriptors and never
follow a symlink (os.fwalk), so a link the agent left cannot point them at a host path.
"""
from __future__ import annotations

import errno
import os
import pwd
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

SANDBOX_USER = "polar-sandbox"
PRIVILEGE_BITS = stat.S_ISUID | stat.S_ISGID
COPY_CHUNK = 1 << 20  # bytes of a sparse file's data copied at a time
MIN_IDS = 65536  # a subordinate range holds an image's users and groups (nobody is 65534)


class IdentityError(RuntimeError):
    pass


@dataclass(frozen=True)
class Identity:
    """The host uid/gid a sandbox's processes run as."""

    uid: int
    gid: int

    def setpriv(self) -> list[str]:
        """The prefix that drops a root process to this identity, with no capability and no other group."""
        return ["setpriv", f"--reuid={self.uid}", f"--regid={self.gid}", "--clear-groups", "--inh-caps=-all", "--"]


def sandbox_identity(user: str = SANDBOX_USER) -> Identity | None:
    """The identity to drop to: None when Polar is unprivileged (the sandbox is the caller), else `user`'s;
    raises IdentityError when root has no such user (run `make setup`)."""
    if os.geteuid() != 0:
        return None
    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        raise IdentityError(f"no `{user}` user: Polar runs as root and never runs a sandbox as root; "
                            "`make setup` creates it (scripts/setup_sandbox_user.sh)") from None
    if entry.pw_uid == 0 or entry.pw_gid == 0:
        raise IdentityError(f"the `{user}` user has uid {entry.pw_uid}, gid {entry.pw_gid}: it must not be root")
    return Identity(entry.pw_uid, entry.pw_gid)


@dataclass(frozen=True)
class IdRange:
    """A user namespace's ids on the host: the namespace's uid 0 is host `uid`, its gid 0 host `gid`."""

    uid: int
    gid: int
    count: int

    def host(self, inside: Identity) -> Identity:
        """Who `inside` (a uid/gid in the namespace) is on the host; IdentityError past the range's end."""
        if not (0 <= inside.uid < self.count and 0 <= inside.gid < self.count):
            raise IdentityError(f"uid {inside.uid} / gid {inside.gid} is outside the sandbox's {self.count} ids")
        return Identity(self.uid + inside.uid, self.gid + inside.gid)


def subordinate_range(user: str = SANDBOX_USER, files: tuple[Path, Path] = (Path("/etc/subuid"),
                                                                            Path("/etc/subgid"))) -> IdRange:
    """`user`'s subordinate uid and gid ranges (the first line of each file naming it); IdentityError when
    either is missing or too small to hold an image's usual users (`make setup` writes them)."""
    found = []
    for path in files:
        try:
            lines = path.read_text().splitlines()
        except OSError:
            lines = []
        entry = next((line.split(":") for line in lines if line.split(":")[0] == user), None)
        if entry is None or len(entry) != 3 or not (entry[1].isdigit() and entry[2].isdigit()):
            raise IdentityError(f"no subordinate id range for `{user}` in {path}: a container's root runs as "
                                "those ids on the host; `make setup` adds them (scripts/setup_sandbox_user.sh)")
        found.append((int(entry[1]), int(entry[2])))
    (uid, uids), (gid, gids) = found
    if uid == 0 or gid == 0 or min(uids, gids) < MIN_IDS:
        raise IdentityError(f"`{user}`'s subordinate ids ({uid}+{uids}, {gid}+{gids}) must start above 0 and "
                            f"hold at least {MIN_IDS}")
    return IdRange(uid, gid, min(uids, gids))


def _walk(top: Path) -> Iterable[tuple[int, list[str]]]:
    """(directory fd, names) for `top` and every directory below it, symlinks never followed."""
    if top.is_symlink() or not top.is_dir():
        return
    for _root, dirs, files, fd in os.fwalk(top, follow_symlinks=False):
        yield fd, ["."] + dirs + files


def hand_over(dirs: Iterable[Path], who: Identity) -> None:
    """Make `who` the owner of these folders and everything in them (links themselves, not their targets)."""
    for top in dirs:
        for fd, names in _walk(Path(top)):
            for name in names:
                try:
                    st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                    if (st.st_uid, st.st_gid) != (who.uid, who.gid):
                        os.chown(name, who.uid, who.gid, dir_fd=fd, follow_symlinks=False)
                except FileNotFoundError:
                    continue


def drop_privilege_bits(dirs: Iterable[Path]) -> int:
    """Clear setuid/setgid on every file and folder below these folders; returns how many had them."""
    cleared = 0
    for top in dirs:
        for fd, names in _walk(Path(top)):
            for name in names:
                try:
                    st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                    if st.st_mode & PRIVILEGE_BITS and (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
                        cleared += _clear(name, fd)
                except FileNotFoundError:
                    continue
    return cleared


def _clear(name: str, dir_fd: int) -> int:
    """Clear the bits through a descriptor of the entry itself (O_NOFOLLOW: a link swapped in is refused)."""
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        st = os.fstat(fd)
        if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
            return 0
        os.fchmod(fd, stat.S_IMODE(st.st_mode) & ~PRIVILEGE_BITS)
        return 1
    finally:
        os.close(fd)


def _copy_file(src: str, dst: str) -> None:
    st = os.lstat(src)
    if stat.S_ISREG(st.st_mode) and st.st_blocks * 512 < st.st_size:
        _copy_sparse(src, dst, st.st_size)
        shutil.copystat(src, dst)
    else:
        shutil.copy2(src, dst)
    mode = os.lstat(dst).st_mode
    if mode & PRIVILEGE_BITS:
        os.chmod(dst, stat.S_IMODE(mode) & ~PRIVILEGE_BITS)


def _copy_sparse(src: str, dst: str, size: int) -> None:
    """Copy only the data extents (SEEK_DATA/SEEK_HOLE), holes stay holes: a 64 GiB sparse file the agent made
    costs the copy no time and no disk (a plain copy writes 64 GiB of zeros)."""
    with open(src, "rb") as fin, open(dst, "wb") as fout:
        i, o, pos = fin.fileno(), fout.fileno(), 0
        while pos < size:
            try:
                start = os.lseek(i, pos, os.SEEK_DATA)
            except OSError as e:
                if e.errno != errno.ENXIO:
                    raise
                break  # nothing but a hole from pos on
            pos = os.lseek(i, start, os.SEEK_HOLE)
            while start < pos and (chunk := os.pread(i, min(pos - start, COPY_CHUNK), start)):
                start += os.pwrite(o, chunk, start)
        os.ftruncate(o, size)


def copy_without_privileges(src: Path, dst: Path) -> None:
    """A copy (a tree, links kept as links) where no file or folder carries setuid/setgid."""
    if src.is_dir() and not src.is_symlink():
        shutil.copytree(src, dst, symlinks=True, dirs_exist_ok=True, copy_function=_copy_file)
        drop_privilege_bits([dst])  # folders' setgid bits (copytree copies their modes)
    else:
        dst.parent.mkdir(parents=True, exist_ok=True)
        _copy_file(str(src), str(dst))
