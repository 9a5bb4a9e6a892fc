"""How the host touches paths the agent shaped (DESIGN.md §10): read a file one directory at a time by
descriptor, never through a symlink, regular files only, size-capped (`read_beneath`); match workspace globs
(`matches_any`); make room at a path without writing through an agent's link (`clear_path`). Used by the
verify ground, the allowlist, the suspicious-change scan and the evaluators."""
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
