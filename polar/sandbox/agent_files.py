"""How the host touches paths the agent shaped (docs/design.md §10): read a file one directory at a time by
descriptor, never through a symlink, regular files only, size-capped (`read_beneath`); match workspace globs
(`matches_any`); make room at a path without writing through an agent's link (`clear_path`); put a task's file
into a workspace the agent's processes may still be changing (`put_beneath`). Used by the verify ground, the
allowlist, the suspicious-change scan, the evaluators and multi-step tasks."""
from __future__ import annotations

import os
import re
import shutil
import stat
from functools import lru_cache
from pathlib import Path

READ_LIMIT = 1 << 20  # bytes of an agent-made file the host reads at most


class AgentFileError(ValueError):
    """A file the agent left cannot be read as one: missing, a symlink, not a regular file, or too large."""


class AgentFileMissing(AgentFileError):
    pass


def read_beneath(root: Path, rel: str, limit: int = READ_LIMIT) -> bytes:
    """The bytes of the regular file `root/rel`, reached without following any symlink; AgentFileError else."""
    parts = Path(rel).parts
    if not parts or Path(rel).is_absolute() or ".." in parts:
        raise AgentFileError(f"{rel!r}: not a path inside the workspace")
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(root, flags | os.O_DIRECTORY)
    try:
        for i, part in enumerate(parts):
            last = i == len(parts) - 1
            step = _open_at(fd, part, flags | (os.O_NONBLOCK if last else os.O_DIRECTORY), rel)
            os.close(fd)
            fd = step
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise AgentFileError(f"{rel} is not a regular file")
        if st.st_size > limit:
            raise AgentFileError(f"{rel} is larger than {limit} bytes ({st.st_size})")
        return os.read(fd, limit + 1)[:limit]
    finally:
        os.close(fd)


def _open_at(dir_fd: int, name: str, flags: int, rel: str) -> int:
    try:
        return os.open(name, flags, dir_fd=dir_fd)
    except FileNotFoundError:
        raise AgentFileMissing(f"no {rel} in the workspace") from None
    except OSError as e:  # ELOOP: a symlink; ENOTDIR: a file where a folder should be
        raise AgentFileError(f"{rel}: {name} is a symlink or not what it should be ({e.strerror})") from None


def matches_any(rel: str, patterns: tuple[str, ...]) -> bool:
    return any(_glob(p).fullmatch(rel) for p in patterns)


@lru_cache(maxsize=256)
def _glob(pattern: str) -> re.Pattern[str]:
    """A workspace glob as a regex: `**/` any folders (none too), `**` anything, `*` and `?` within one name;
    a pattern naming a folder covers what is inside it."""
    pattern = pattern[:-3] if pattern.endswith("/**") else pattern  # the folder itself too (replaced by a link)
    out, i = "", 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif pattern[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif pattern[i] == "?":
            out, i = out + "[^/]", i + 1
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return re.compile(out.rstrip("/") + "(?:/.*)?")


def clear_path(workspace: Path, rel: str) -> None:
    """Make room at workspace/rel: every folder on the way a real folder (a symlink or file there is removed, so
    nothing is written through an agent's link), and nothing at rel itself."""
    here = workspace
    for part in Path(rel).parts[:-1]:
        here = here / part
        if here.is_symlink() or (here.exists() and not here.is_dir()):
            here.unlink()
        here.mkdir(exist_ok=True)
    target = workspace / rel
    if target.is_dir() and not target.is_symlink():
        shutil.rmtree(target)
    elif target.exists() or target.is_symlink():
        target.unlink()


def put_beneath(root: Path, rel: str, src: Path) -> None:
    """Copy the host's file (or link) `src` to root/rel while the agent's processes may be changing root: every
    folder on the way is opened by descriptor without following a link (a link, file or anything else there is
    replaced by a folder), whatever is at rel is removed, and the file is created there exclusively. So nothing is
    written through a link of the agent's, even one it makes while this runs; at worst a folder the agent moves
    meanwhile gets the file, inside its own workspace."""
    parts = Path(rel).parts
    if not parts or Path(rel).is_absolute() or ".." in parts:
        raise ValueError(f"{rel!r}: not a path inside the workspace")
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        for part in parts[:-1]:
            fd = _descend(fd, part)
        _remove_at(fd, parts[-1])
        if src.is_symlink():
            os.symlink(os.readlink(src), parts[-1], dir_fd=fd)
            return
        mode = 0o755 if os.stat(src).st_mode & 0o100 else 0o644
        out = os.open(parts[-1], os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=fd)
        with open(src, "rb") as fin, os.fdopen(out, "wb") as fout:
            shutil.copyfileobj(fin, fout)
    finally:
        os.close(fd)


def folder_beneath(root: Path, rel: str) -> None:
    """Make root/rel a real folder, as `put_beneath` makes the folders on its way: a link or file the agent left
    there is replaced, nothing is followed."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        for part in Path(rel).parts:
            fd = _descend(fd, part)
    finally:
        os.close(fd)


def _descend(fd: int, name: str) -> int:
    """The folder `name` in the folder `fd` (a real one: made, or put in place of what is there); `fd` is closed
    once it is open."""
    for _ in range(8):  # the agent may swap it between two calls; it cannot keep doing so for long
        try:
            child = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
        except FileNotFoundError:
            pass
        except OSError:  # ELOOP, ENOTDIR: a link or a file where the folder goes
            _remove_at(fd, name)
        else:
            os.close(fd)
            return child
        try:
            os.mkdir(name, 0o755, dir_fd=fd)
        except FileExistsError:
            pass
    raise OSError(f"{name}: could not make a folder there (it kept changing)")


def _remove_at(fd: int, name: str) -> None:
    try:
        st = os.stat(name, dir_fd=fd, follow_symlinks=False)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(name, dir_fd=fd)
    else:
        os.unlink(name, dir_fd=fd)
