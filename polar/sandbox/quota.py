"""A per-sample disk quota (issue 43): what the agent writes lives on a filesystem of its own.

The task's `storage_mb` (Harbor's [environment] storage_mb), else the node's POLAR_STORAGE_MB (default 10 GiB;
0: none), bounds the agent's writable folders, HOME and the workspace, together: a sparse file in the sample
folder is formatted ext4 (no journal, no blocks reserved for root) and loop-mounted at its `.disk/`, and HOME and
the workspace are bind-mounted from it at their usual paths, so nothing else changes while it runs. Past the size
the agent's writes fail with ENOSPC, and nothing else on the node fills up; the file costs the host only what was
written (~4 MB for an empty 10 GiB one). The verify ground gets a disk of its own, sized for what it can hold (the
pristine workspace and the agent's allowed changes), so the host never holds more than twice the quota and the
task's own files for one sample.

Loop mounts need root; an unprivileged node, or one without loop devices, runs without a quota and says so in
one line. The mounts are registered with the run's watchdog (polar/sandbox/supervisor.py), so a killed run leaves
none. `remove_disk` copies what the agent left back to the sample folder before it unmounts (the copy is
bounded by the quota too), so afterwards the folder reads as it would without one.

Cost (issue 47): a sample makes two disks, five mounts and five unmounts. They are system calls here, not
`mount`/`umount` processes (0.7 ms of CPU against 8 ms for a loop mount, a bind and their unmounts), and a disk
of a size made before is written from that first format's blocks (2 ms) instead of running mkfs.ext4 again.
"""
from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import shutil
import stat
import struct
import subprocess
import sys
from pathlib import Path
from typing import Sequence

from polar.sandbox import supervisor
from polar.sandbox.identity import copy_without_privileges, drop_privilege_bits

DEFAULT_ENV = "POLAR_STORAGE_MB"
DEFAULT_MB = 10240
MIN_MB = 16  # an ext4 of less holds almost nothing
SLACK_MB = 16  # a verify disk's room for the filesystem's own blocks and inodes
DISK = ".disk"  # the sample folder's mount point for the agent's filesystem (HOME and the workspace)
VERIFY_DISK = ".verify-disk"  # and for the verify ground's
UNENFORCED = "polar: disk quota not enforced ({why}): the agent's writes are bounded only by the host's disk"
_warned: set[str] = set()


class QuotaError(RuntimeError):
    pass


def quota_mb(storage_mb: int | None) -> int | None:
    """The quota in force for a task: its own, else the node's default; None for none."""
    if storage_mb is not None:
        return max(MIN_MB, int(storage_mb))
    raw = os.environ.get(DEFAULT_ENV, str(DEFAULT_MB)).strip()
    try:
        mb = int(raw)
    except ValueError:
        raise QuotaError(f"{DEFAULT_ENV}={raw!r}: expected a number of megabytes (0: no quota)") from None
    return max(MIN_MB, mb) if mb > 0 else None


def unavailable() -> str | None:
    """Why this process cannot make a disk (None: it can)."""
    if os.geteuid() != 0:
        return "loop mounts need root"
    if not shutil.which("mkfs.ext4", path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin"):
        return "mkfs.ext4 (e2fsprogs) not found"
    if not Path("/dev/loop-control").exists():
        return "no loop devices (/dev/loop-control)"
    return None


def warn_unenforced(why: str) -> None:
    if why not in _warned:
        _warned.add(why)
        print(UNENFORCED.format(why=why), file=sys.stderr, flush=True)


def image_of(disk: Path) -> Path:
    return disk.parent / f".{disk.name}.img"


def make_disk(disk: Path, size_mb: int, binds: Sequence[tuple[str, Path]]) -> None:
    """A filesystem of `size_mb` of its own (nosuid, nodev) mounted at `disk`; each (name, target) of `binds`: the
    disk's folder `name` seen at `target` (an empty folder) too. Undone by remove_disk."""
    disk.mkdir(parents=True, exist_ok=True)
    image = image_of(disk)
    _format(image, size_mb)
    supervisor.watch_command(watch_key(disk), ["umount", "-l", str(disk)])
    try:
        _loop_mount(image, disk)
    except QuotaError:
        supervisor.release(watch_key(disk))
        image.unlink(missing_ok=True)
        raise
    (disk / "lost+found").rmdir()  # e2fsck's; the agent would see it in its workspace
    for name, target in binds:
        (disk / name).mkdir()
        target.mkdir(parents=True, exist_ok=True)
        supervisor.watch_command(watch_key(target), ["umount", "-l", str(target)])
        _mount(str(disk / name), target, None, MS_BIND)


def remove_disk(disk: Path, binds: Sequence[tuple[str, Path]], keep: bool = True) -> None:
    """Unmount the disk and its binds and delete its file; with `keep`, what each bound folder holds is copied to
    its target first (links as links, holes as holes, no setuid bit), so the sample folder reads as it would
    without a quota. Safe to call for a disk that is not there."""
    for name, target in binds:
        if os.path.ismount(target):
            _umount(target)
            if keep and (disk / name).is_dir():
                _copy_back(disk / name, target)
        supervisor.release(watch_key(target))
    if os.path.ismount(disk):
        _umount(disk)  # the loop device lets go of the file with it (autoclear)
    supervisor.release(watch_key(disk))
    image_of(disk).unlink(missing_ok=True)
    if disk.is_dir():
        disk.rmdir()


def _copy_back(src: Path, dst: Path) -> None:
    """What the agent left on its disk, into the sample folder: links as links, holes as holes, no setuid bit. A
    small tree of plain files and links is copied here (a `cp` process for each bound folder was ~3% of a
    zero-work sample's CPU); anything larger, or holding a fifo, socket or device, by `cp -a`."""
    if _small_plain_tree(src):
        copy_without_privileges(src, dst)
        return
    _run(["cp", "-a", "--sparse=always", f"{src}/.", f"{dst}/"])
    drop_privilege_bits([dst])


SMALL_TREE = (256, 8 << 20)  # entries, bytes: what _copy_back copies in this process


def _small_plain_tree(top: Path) -> bool:
    entries, size = 0, 0
    for root, dirs, files in os.walk(top):  # links to folders are listed in dirs, not followed
        for name in dirs + files:
            st = os.lstat(os.path.join(root, name))
            entries, size = entries + 1, size + st.st_size
            if entries > SMALL_TREE[0] or size > SMALL_TREE[1] or not (
                    stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode) or stat.S_ISLNK(st.st_mode)):
                return False
    return True


def used_bytes(folder: Path) -> int:
    """What the disk holds (for the figures): its size less what is free."""
    st = os.statvfs(folder)
    return (st.f_blocks - st.f_bfree) * st.f_frsize


def tree_mb(top: Path | None) -> int:
    """Megabytes a folder (or a .tar.gz) takes, rounded up, with a margin for directories and small files."""
    if top is None:
        return 0
    if not top.is_dir():
        return (top.stat().st_size * 4 >> 20) + 1  # a compressed workspace: its content is a few times larger
    total = 0
    for dirpath, dirs, files in os.walk(top):
        total += 4096 * (1 + len(dirs))
        for name in files:
            try:
                total += max(4096, os.lstat(os.path.join(dirpath, name)).st_size)
            except OSError:
                pass
    return (total >> 20) + 1


def watch_key(path: Path) -> str:
    return f"mount:{path}"


def _run(argv: list[str]) -> None:
    env = {**os.environ, "PATH": os.environ.get("PATH", "") + ":/usr/sbin:/sbin"}
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)
    if proc.returncode != 0:
        raise QuotaError(f"`{' '.join(argv[:2])}` failed: {(proc.stderr or proc.stdout).strip()[-300:]}")


def _format(image: Path, size_mb: int) -> None:
    """`image`: a sparse file of `size_mb` holding an empty ext4 (no journal, nothing reserved for root)."""
    blocks = _FORMATTED.get(size_mb)
    with open(image, "wb") as f:
        f.truncate(size_mb << 20)
        for offset, data in blocks or ():
            view = memoryview(data)
            while view:
                written = os.pwrite(f.fileno(), view, offset)
                view, offset = view[written:], offset + written
    if blocks is None:
        _run(["mkfs.ext4", "-q", "-F", "-m", "0", "-O", "^has_journal", str(image)])
        _keep_format(size_mb, image)


def _keep_format(size_mb: int, image: Path) -> None:
    blocks = _written_blocks(image)
    if blocks is not None:
        _FORMATTED[size_mb] = blocks
        while len(_FORMATTED) > FORMATS_KEPT:
            del _FORMATTED[next(iter(_FORMATTED))]


FORMATS_KEPT = 4  # sizes whose format this process keeps: the agent's disk and a few tasks' verify disks
FORMAT_MAX_BYTES = 64 << 20  # a filesystem that cannot tell holes from data is not kept
_FORMATTED: dict[int, tuple[tuple[int, bytes], ...]] = {}  # size_mb -> (offset, bytes) mkfs wrote, ~4 MB at 10 GiB


def _written_blocks(image: Path) -> tuple[tuple[int, bytes], ...] | None:
    """What mkfs wrote, as (offset, bytes) runs (SEEK_DATA/SEEK_HOLE); None when over FORMAT_MAX_BYTES."""
    with open(image, "rb") as f:
        runs, offset = [], 0
        while True:
            try:
                start = os.lseek(f.fileno(), offset, os.SEEK_DATA)
            except OSError as e:
                if e.errno == errno.ENXIO:  # no data after offset
                    break
                raise
            offset = os.lseek(f.fileno(), start, os.SEEK_HOLE)
            runs.append((start, offset))
        if sum(end - start for start, end in runs) > FORMAT_MAX_BYTES:
            return None
        return tuple((start, os.pread(f.fileno(), end - start, start)) for start, end in runs)


def _loop_mount(image: Path, target: Path) -> None:
    """`mount -o loop,nosuid,nodev image target`, as system calls."""
    try:
        fd, number = _attach_loop(image)
    except OSError as e:
        raise QuotaError(f"loop device for {image}: {e.strerror or e}") from None
    try:
        _mount(f"/dev/loop{number}", target, "ext4", MS_NOSUID | MS_NODEV)
    except QuotaError:
        fcntl.ioctl(fd, LOOP_CLR_FD, 0)
        raise
    finally:
        os.close(fd)  # the mount holds the device now; autoclear frees it at the unmount


# <linux/loop.h>, <linux/mount.h>
LOOP_SET_FD, LOOP_CLR_FD, LOOP_SET_STATUS64, LOOP_CONFIGURE, LOOP_CTL_GET_FREE = 0x4C00, 0x4C01, 0x4C04, 0x4C0A, 0x4C82
LO_FLAGS_AUTOCLEAR = 4
MS_NOSUID, MS_NODEV, MS_BIND = 2, 4, 4096
MNT_DETACH = 2
_libc = ctypes.CDLL(None, use_errno=True)


def _loop_info(image: Path) -> bytes:
    """struct loop_info64: autoclear, and the file's name for `losetup -l`."""
    return struct.pack("=5Q4I64s64s32s2Q", 0, 0, 0, 0, 0, 0, 0, 0, LO_FLAGS_AUTOCLEAR,
                       os.fsencode(image)[:63], b"", b"", 0, 0)


def _attach_loop(image: Path) -> tuple[int, int]:
    """A free loop device backed by `image`: (its open fd, its number); OSError otherwise. Another process may
    take the free device between asking and binding: then ask again."""
    backing = os.open(image, os.O_RDWR | os.O_CLOEXEC)
    try:
        control = os.open("/dev/loop-control", os.O_RDWR | os.O_CLOEXEC)
        try:
            for _ in range(64):
                number = fcntl.ioctl(control, LOOP_CTL_GET_FREE)
                fd = os.open(f"/dev/loop{number}", os.O_RDWR | os.O_CLOEXEC)
                try:
                    _bind_loop(fd, backing, image)
                except OSError as e:
                    os.close(fd)
                    if e.errno == errno.EBUSY:
                        continue
                    raise
                return fd, number
        finally:
            os.close(control)
    finally:
        os.close(backing)
    raise OSError(errno.EBUSY, "every free one was taken by another process, 64 times")


def _bind_loop(fd: int, backing: int, image: Path) -> None:
    try:  # Linux 5.8+: one call
        fcntl.ioctl(fd, LOOP_CONFIGURE, struct.pack("=II", backing, 0) + _loop_info(image) + bytes(64))
    except OSError as e:
        if e.errno not in (errno.EINVAL, errno.ENOTTY):
            raise
        fcntl.ioctl(fd, LOOP_SET_FD, backing)
        fcntl.ioctl(fd, LOOP_SET_STATUS64, _loop_info(image))


def _mount(source: str, target: Path, fstype: str | None, flags: int) -> None:
    if _libc.mount(os.fsencode(source), os.fsencode(target), fstype.encode() if fstype else None, flags, None):
        raise QuotaError(f"mount {source} on {target}: {os.strerror(ctypes.get_errno())}")


def _umount(target: Path) -> None:
    """`umount -l`: detached now, released when its last user lets go."""
    if _libc.umount2(os.fsencode(target), MNT_DETACH):
        raise QuotaError(f"umount {target}: {os.strerror(ctypes.get_errno())}")
