"""A task's starting workspace, as every stage that starts from it gets it: the sample's sandbox, the verifier's
pristine ground, the oracle, a step's layered workspace."""
from __future__ import annotations

import os
import tarfile
from pathlib import Path
from typing import Any

from polar.sandbox.identity import copy_without_privileges


def pristine(workspace: Path | None, dest: Path) -> None:
    """The task's starting workspace, as a sample's sandbox gets it (a directory or a .tar.gz; none: empty)."""
    if workspace is None:
        dest.mkdir(parents=True)
    elif workspace.is_dir():
        copy_without_privileges(workspace, dest)  # holes stay holes: a task may ship a large sparse file
    else:
        with tarfile.open(workspace, "r:gz") as tar:
            tar.extractall(dest, filter="data")
    dest.mkdir(parents=True, exist_ok=True)


def listing(path: Path | None) -> Any:
    """What identifies a folder's (or a file's) content for a cache key: each entry's path, size, mtime and mode."""
    if path is None:
        return None
    if not path.is_dir():
        st = path.stat()
        return [str(path), st.st_size, st.st_mtime_ns]
    found = [str(path)]
    for dirpath, dirs, files in os.walk(path):
        dirs.sort()
        for name in sorted(files):
            st = os.lstat(os.path.join(dirpath, name))
            found.append([os.path.relpath(os.path.join(dirpath, name), path), st.st_size, st.st_mtime_ns, st.st_mode])
    return found
