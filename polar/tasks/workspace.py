"""A task's starting workspace, as every stage that starts from it gets it: the sample's sandbox, the verifier's
pristine ground, the oracle, a step's layered workspace."""
from __future__ import annotations

import tarfile
from pathlib import Path

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
