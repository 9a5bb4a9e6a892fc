"""A task's artifacts (Harbor's `artifacts`): files of the agent's final workspace kept in the sample folder, for a
person to look at; they decide nothing. Read as the agent left them: no link followed on the way (a link itself
is kept as a link), no setuid bit, at most ARTIFACT_LIMIT bytes in all."""
from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Sequence

from polar.sandbox.identity import copy_without_privileges

ARTIFACT_LIMIT = 64 << 20


def keep_artifacts(workspace: Path, paths: Sequence[tuple[str, str]], dest: Path) -> list[str]:
    """Copy each (workspace path, name) that exists to dest/name (`.`: the whole workspace); the ones kept
    (`path`, or `path -> name`), or why one was not."""
    kept, budget = [], ARTIFACT_LIMIT
    for rel, name in paths:
        shown = rel if rel == name else f"{rel} -> {name}"
        src = workspace / rel if rel != "." else workspace
        if _linked_parent(workspace, rel):
            kept.append(f"{shown}: not kept (a link on its way)")
            continue
        if not os.path.lexists(src):
            kept.append(f"{shown}: not there")
            continue
        size = _size(src)
        if size > budget:
            kept.append(f"{shown}: not kept ({size} bytes; {ARTIFACT_LIMIT} in all)")
            continue
        budget -= size
        copy_without_privileges(src, dest / name)
        kept.append(shown)
    return kept


def _linked_parent(workspace: Path, rel: str) -> bool:
    """Whether a folder on the way from the workspace to `rel` is a link (the agent may point one anywhere)."""
    here = workspace
    for part in Path(rel).parts[:-1]:
        here = here / part
        if here.is_symlink():
            return True
    return False


def _size(path: Path) -> int:
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        return st.st_size
    return sum(os.lstat(os.path.join(d, f)).st_size for d, _dirs, files in os.walk(path) for f in files)
