"""What the container runtime may do with a task's image inputs (docs/tasks.md "Images"): hash a Dockerfile's
build context within caps, and pull an image only when the operator allows it.

A build context is a task's data (a downloaded dataset): its size is taken from each file's metadata before any
byte is read, so a 64 GiB sparse file is refused at once instead of being read into memory; the files that fit
are hashed in chunks. Links are hashed as their target text, never followed. Pulls: POLAR_PULL=never (the default:
a node makes no outside request for a task's sake) or missing (pull an image the node lacks).
"""
from __future__ import annotations

import hashlib
import os
import stat
from dataclasses import dataclass
from pathlib import Path

MAX_BYTES_ENV = "POLAR_BUILD_CONTEXT_MAX_BYTES"
MAX_FILES_ENV = "POLAR_BUILD_CONTEXT_MAX_FILES"
PULL_ENV = "POLAR_PULL"
PULL_POLICIES = ("never", "missing")
DEFAULT_MAX_BYTES = 2 << 30  # apparent size: what the engine would send to its builder
DEFAULT_MAX_FILES = 100_000
CHUNK = 1 << 20


class ContextError(ValueError):
    """A build context over a cap, or a policy value that is not one; one line naming it."""


@dataclass(frozen=True)
class Caps:
    max_bytes: int = DEFAULT_MAX_BYTES
    max_files: int = DEFAULT_MAX_FILES


def caps_from_env() -> Caps:
    return Caps(_count(MAX_BYTES_ENV, DEFAULT_MAX_BYTES), _count(MAX_FILES_ENV, DEFAULT_MAX_FILES))


def _count(name: str, default: int) -> int:
    text = os.environ.get(name)
    if not text:
        return default
    if not text.isdigit() or int(text) <= 0:
        raise ContextError(f"{name}={text!r}: expected a positive whole number")
    return int(text)


def context_digest(context: Path, caps: Caps) -> str:
    """sha256 over every entry's relative path, kind, executable bits and contents (a link: its target), sorted;
    raises ContextError naming the cap as soon as the sizes or the count pass it, before reading any file. The
    executable bits count: COPY keeps them, so a `chmod +x` in the context is another image."""
    entries = _entries(context, caps)
    digest = hashlib.sha256()
    for rel, kind, size in entries:
        modes = os.lstat(context / rel).st_mode & 0o111 if kind == "file" else 0
        digest.update(f"{rel}\0{kind}\0{modes:o}\0".encode(errors="surrogateescape"))
        if kind == "link":
            digest.update(os.readlink(context / rel).encode(errors="surrogateescape"))
        elif kind == "file":
            _hash_file(context / rel, size, digest)
        digest.update(b"\0")
    return digest.hexdigest()


def _entries(context: Path, caps: Caps) -> list[tuple[str, str, int]]:
    """(relative path, file|link|dir, size) of everything below `context`, links not followed, within caps."""
    found: list[tuple[str, str, int]] = []
    total = 0
    for top, dirs, files, dir_fd in os.fwalk(context, follow_symlinks=False):
        rel_top = os.path.relpath(top, context)
        for name in sorted(dirs) + sorted(files):
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            kind = "link" if stat.S_ISLNK(st.st_mode) else "dir" if stat.S_ISDIR(st.st_mode) else \
                "file" if stat.S_ISREG(st.st_mode) else None
            if kind is None:
                continue  # a fifo or socket: no content the engine sends
            size = st.st_size if kind == "file" else 0
            total += size
            rel = os.path.normpath(os.path.join(rel_top, name))
            found.append((rel, kind, size))
            if len(found) > caps.max_files:
                raise ContextError(f"build context {context}: more than {caps.max_files} files (raise "
                                   f"{MAX_FILES_ENV} to allow more)")
            if total > caps.max_bytes:
                raise ContextError(f"build context {context}: more than {caps.max_bytes} bytes (at {rel}, {size} "
                                   f"bytes; raise {MAX_BYTES_ENV} to allow more)")
    return sorted(found)


def _hash_file(path: Path, size: int, digest) -> None:
    """At most the `size` bytes counted (a file that grew since is not read past it), in chunks, no link followed."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb") as f:
        while size > 0 and (chunk := f.read(min(CHUNK, size))):
            size -= len(chunk)
            digest.update(chunk)


def pull_policy() -> str:
    value = os.environ.get(PULL_ENV) or "never"
    if value not in PULL_POLICIES:
        raise ContextError(f"{PULL_ENV}={value!r}: expected one of {', '.join(PULL_POLICIES)}")
    return value


def missing_image(ref: str, engine_kind: str) -> str:
    """The one line for an image the node lacks while pulls are not allowed."""
    return (f"docker runtime: image {ref} is not on this node and {PULL_ENV} is never (the default): "
            f"`{engine_kind} pull {ref}` (or `load`) it here first, or set {PULL_ENV}=missing to let samples pull")
