"""Shared-prefix files of capture format 2 (docs/captures.md): `<capture_dir>/_shared/<digest>.json` holds the
ids and request parts that many sessions' first calls share (a harness's system prompt and tools), once; a line
refers to it by digest instead of repeating it. This module puts those files in place and carries them along
when a capture file is copied or moved; polar_traj.captures decides what goes in them, capture_reader reads them."""
from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from .atomic import temp_beside

SHARED_DIR = "_shared"  # beside the task folders (a task id cannot start with "_"); its files do not end in .jsonl
SHARED_VERSION = 1
DIGEST = re.compile(r"[0-9a-f]{32}")  # blake2b, 16 bytes, of a shared file's bytes: its name
_SHARED_REF = re.compile(rb'"(?:prompt_prefix|request_base)":\{"shared":"([0-9a-f]{32})"')  # as the writer writes it


def shared_path(capture_file: str | os.PathLike, digest: str) -> Path:
    """Where a capture file's shared prefix `digest` lives: `<root>/_shared/` beside its task folder."""
    return Path(capture_file).parent.parent / SHARED_DIR / f"{digest}.json"


def write_shared(path: Path, data: bytes, fsync: bool = True) -> None:
    """Put a shared prefix's file in place whole (a temporary name, then a rename) and, with fsync, durable
    (file and folder) before any line refers to it. A file already there under this name holds these
    bytes (the name is their digest: another writer, or this one before a restart, wrote it) and is kept."""
    if not path.exists():
        made = not path.parent.is_dir()
        path.parent.mkdir(parents=True, exist_ok=True)
        if made and fsync:
            _fsync_dir(path.parent.parent)
        tmp = temp_beside(path)
        try:
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                if fsync:
                    os.fsync(f.fileno())
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
    if fsync:  # the rename, or another writer's that may not be durable yet
        _fsync_dir(path.parent)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def shared_files(path: str | os.PathLike) -> list[Path]:
    """The shared-prefix files a capture file refers to (`<root>/_shared/<digest>.json` beside its task
    folder), each once. Found as the writer writes the references, so a request's text never adds one
    that is not in `_shared`; a listed file may be missing (the reader then names it)."""
    path = Path(path)
    digests = dict.fromkeys(m.decode() for m in _SHARED_REF.findall(path.read_bytes()))
    return [shared_path(path, d) for d in digests]


def copy_capture(src: str | os.PathLike, dst: str | os.PathLike, move: bool = False) -> Path:
    """Copy (move=True: move) a capture file to `dst` (`<root>/<task>/<session>.jsonl`) with the shared
    prefixes it refers to, those first, into `<root>/_shared/`: the file is never where they are not.
    Shared files are copied even on a move (other sessions refer to them); one already there is kept."""
    src, dst = Path(src), Path(dst)
    for shared in shared_files(src):
        target = shared_path(dst, shared.stem)
        if not target.exists() and shared.is_file():  # a missing one is the reader's to report
            write_shared(target, shared.read_bytes(), fsync=False)
    dst.parent.mkdir(parents=True, exist_ok=True)
    if move:
        shutil.move(src, dst)
    else:
        shutil.copyfile(src, dst)
    return dst
