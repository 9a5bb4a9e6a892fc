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
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Sequence

from polar.sandbox import supervisor
from polar.sandbox.identity import drop_privilege_bits

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
    with open(image, "wb") as f:
        f.truncate(size_mb << 20)
    _run(["mkfs.ext4", "-q", "-F", "-m", "0", "-O", "^has_journal", str(image)])
    supervisor.watch_command(watch_key(disk), ["umount", "-l", str(disk)])
    try:
        _run(["mount", "-o", "loop,nosuid,nodev", str(image), str(disk)])
    except QuotaError:
        supervisor.release(watch_key(disk))
        image.unlink(missing_ok=True)
        raise
    (disk / "lost+found").rmdir()  # e2fsck's; the agent would see it in its workspace
    for name, target in binds:
        (disk / name).mkdir()
        target.mkdir(parents=True, exist_ok=True)
        supervisor.watch_command(watch_key(target), ["umount", "-l", str(target)])
        _run(["mount", "--bind", str(disk / name), str(target)])


def remove_disk(disk: Path, binds: Sequence[tuple[str, Path]], keep: bool = True) -> None:
    """Unmount the disk and its binds and delete its file; with `keep`, what each bound folder holds is copied to
    its target first (links as links, holes as holes, no setuid bit), so the sample folder reads as it would
    without a quota. Safe to call for a disk that is not there."""
    for name, target in binds:
        if os.path.ismount(target):
            _run(["umount", "-l", str(target)])
            if keep and (disk / name).is_dir():
                _run(["cp", "-a", "--sparse=always", f"{disk / name}/.", f"{target}/"])
                drop_privilege_bits([target])
        supervisor.release(watch_key(target))
    if os.path.ismount(disk):
        _run(["umount", "-l", str(disk)])
    supervisor.release(watch_key(disk))
    image_of(disk).unlink(missing_ok=True)
    if disk.is_dir():
        disk.rmdir()


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
