"""This node's own accounting of the samples it runs (issue 40 item 5): how many sample stages (a harness or a
verifier) are running on the machine now, across every process of every worker and `polar run`.

A stage holds an flock on a file of its own in one node-wide folder while it runs; `running()` counts the files
whose lock is held. Only host processes take these locks, so nothing a sandbox runs (an agent's fork bomb that
raises the load average) can raise the count: it is what decides whether a verifier's timeout was the machine's.
"""
from __future__ import annotations

import fcntl
import os
import secrets
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

FOLDER = Path(os.environ.get("POLAR_OCCUPANCY_DIR", "/tmp/polar-occupancy"))


@contextmanager
def occupying(folder: Path | None = None) -> Iterator[None]:
    """Count one running stage while the block runs. The folder is shared by every user running samples here
    (sticky, like /tmp); a stage that cannot register (a read-only /tmp) still runs, uncounted."""
    folder = folder or FOLDER
    name = f"{os.getpid()}-{secrets.token_hex(4)}"
    path, tmp = folder / name, folder / f".{name}"  # locked before it has a name running() reads
    try:
        _shared_folder(folder)
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
    except OSError:
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.rename(tmp, path)
        yield
    finally:
        for p in (path, tmp):
            try:
                p.unlink(missing_ok=True)
            except OSError:
                pass
        os.close(fd)


def _shared_folder(folder: Path) -> None:
    if not folder.is_dir():
        folder.mkdir(parents=True, exist_ok=True)
        try:
            os.chmod(folder, 0o1777)  # whoever made it, every user's stages count in it
        except OSError:
            pass


def running(folder: Path | None = None) -> int:
    """The stages running on this node now; files left by a process that died (no lock held) are removed."""
    folder = folder or FOLDER
    count = 0
    try:
        names = os.listdir(folder)
    except OSError:
        return 0
    for name in names:
        if name.startswith("."):
            continue
        path = folder / name
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            count += 1  # held by a running stage
        else:
            try:
                path.unlink(missing_ok=True)  # its process died without cleaning up
            except OSError:  # another user's, in the sticky folder: theirs to remove
                pass
        finally:
            os.close(fd)
    return count


def slots() -> int:
    """The stages this node can run at full speed: its cores (POLAR_SLOTS overrides)."""
    value = os.environ.get("POLAR_SLOTS", "")
    return int(value) if value.isdigit() and int(value) > 0 else (os.cpu_count() or 1)
