"""Files that appear whole or not at all: write to a temporary name beside the target, rename when done.

One home for the pattern every writer of Polar uses (Parquet parts, exports, sample state, manifests, reports),
so a reader never takes a partial file for whole, whoever is killed mid-write."""
from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator


def temp_beside(path: Path) -> Path:
    """A hidden name in the target's folder (same filesystem, so the rename is atomic), unique per writer."""
    return path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")


@contextmanager
def replacing(path: str | os.PathLike, mode: int | None = None) -> Iterator[Path]:
    """Yield a temporary path to write; it replaces `path` when the block ends cleanly, else it is removed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_beside(path)
    try:
        yield tmp
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_text(path: str | os.PathLike, text: str, mode: int | None = None) -> Path:
    """Write `text` to `path` atomically; returns the path."""
    with replacing(path, mode) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return Path(path)


def made_once(dest: Path, make: Callable[[Path], None]) -> Path:
    """A folder made once and then reused (a cache entry): `make` fills a temporary folder beside `dest`, which
    is renamed into place (mode 0755) when it returns; a reader never sees a half-made one, and when another
    maker got there first, theirs stands and this one is dropped."""
    if dest.is_dir():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    try:
        make(tmp)
        os.chmod(tmp, 0o755)  # mkdtemp's 0700 would become the folder's own mode
        try:
            os.rename(tmp, dest)
        except OSError:
            if not dest.is_dir():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return dest
