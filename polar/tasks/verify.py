"""The ground a verifier stands on (DESIGN.md §10, docs/tasks.md "Verification"): nothing the agent wrote may
decide its reward.

After the harness exited and its sandbox is gone, `prepare_verify` builds `<sample>/verify/`: the task's
**pristine** workspace with only the agent's allowed changes applied (`submit:`, polar/tasks/allow.py), the
task's own `tests:` staged over it, and a fresh HOME. The evaluator then runs there, in a new sandbox. Every
change the agent made outside the allowlist, and the Python start-up hooks it left in its HOME, come back as
`tampered`; changes that reach for the verifier (process exit, atexit, pytest internals, import hooks, compiled
files: polar/tasks/suspicious.py) as `suspicious`, kept or not. Both are the cheap, always-on sign of a policy
going for the verifier instead of the task.

`read_beneath` is how the host reads a file the agent may have shaped: one directory at a time by descriptor,
never through a symlink, regular files only, size-capped.
"""
from __future__ import annotations

import os
import re
import shutil
import stat
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from polar.sandbox.identity import copy_without_privileges
from polar.sandbox.runtime import Mounts
from polar.tasks.task import LOGS_AT, TESTS_AT, TaskSpec

READ_LIMIT = 1 << 20  # bytes of an agent-made file the host reads at most
HOME_HOOKS = ("usercustomize.py", "sitecustomize.py")  # run by any python that sees a user site
HOOK_SUFFIXES = (".pth",)  # lines starting with `import` run at start-up from a site-packages folder
LISTED = 100  # dropped changes named one by one at most (an agent may leave a million files)


class AgentFileError(ValueError):
    """A file the agent left cannot be read as one: missing, a symlink, not a regular file, or too large."""


class AgentFileMissing(AgentFileError):
    pass


@dataclass(frozen=True)
class VerifyGround:
    mounts: Mounts  # the verifier's HOME, workspace (pristine + allowed changes + tests) and an empty socket folder
    tampered: tuple[str, ...]  # agent changes dropped (workspace paths), and ~/… start-up hooks
    suspicious: tuple[str, ...] = ()  # "PATH: WHAT" for changes that reach for the verifier (suspicious.py)


def prepare_verify(task: TaskSpec, out: Path, before: dict[str, str], after: dict[str, str]) -> VerifyGround:
    """Build `out/verify` from the task's pristine workspace and the agent's final one, `out/workspace`.
    `before` and `after` are the workspace's snapshots (relative path -> digest) at the harness's start and end:
    a path alike in both was not the agent's doing (a file the harness wrote), so it is left out unnamed."""
    from polar.tasks.allow import apply_submission, shown
    from polar.tasks.suspicious import scan_changes

    root = out / "verify"
    shutil.rmtree(root, ignore_errors=True)  # a retried stage starts from the pristine workspace again
    workspace, home, shared = root / "workspace", root / "home", root / "shared"
    for d in (home / ".tmp", shared):
        d.mkdir(parents=True)
    harbor = task.evaluator.kind == "harbor"  # its tests go to /tests, its reward to /logs (not the workspace)
    staged = _files_under(task.tests) if task.tests and not harbor else []
    untouched = {p for p, digest in before.items() if after.get(p) == digest}
    submission = apply_submission(task, out / "workspace", workspace, staged, untouched)
    for rel in staged:
        _put(task.tests / rel, workspace, rel)
    dropped = list(submission.dropped)
    if len(dropped) > LISTED:
        dropped = [*dropped[:LISTED], f"... and {len(dropped) - LISTED} more"]
    hooks = [f"~/{shown(p)}" for p in home_hooks(out / "home")]
    suspicious = scan_changes(out / "workspace", submission) + [f"{h}: Python start-up hook" for h in hooks]
    binds, ro_binds = _harbor_binds(task, root) if harbor else ((), ())
    return VerifyGround(Mounts(home, workspace, shared, binds, ro_binds), tuple(dropped + hooks), tuple(suspicious))


def _harbor_binds(task: TaskSpec, root: Path) -> tuple[tuple[tuple[Path, str], ...], tuple[tuple[Path, str], ...]]:
    """A Harbor verifier's folders (writable, read-only): an empty /logs/verifier for its reward, made here and
    nowhere the agent was; the task's tests at /tests, read-only, so that the agent's code the tests import
    cannot rewrite test.sh or the tests while they run."""
    tests, logs = root / "tests", root / "logs"
    if task.tests:
        copy_without_privileges(task.tests, tests)
    tests.mkdir(exist_ok=True)
    (logs / "verifier").mkdir(parents=True)
    return ((logs, LOGS_AT),), ((tests, TESTS_AT),)


def home_hooks(home: Path) -> list[str]:
    """Python start-up hooks under the agent's HOME (user site): what would run inside a verifier given it."""
    found = []
    for dirpath, dirs, files in os.walk(home):  # links are not followed
        dirs[:] = [d for d in dirs if d != "node_modules"]
        in_site = Path(dirpath).name == "site-packages"
        for name in files:
            if name in HOME_HOOKS or (in_site and name.endswith(HOOK_SUFFIXES)):
                found.append(str((Path(dirpath) / name).relative_to(home)))
    return sorted(found)


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


def _files_under(top: Path) -> list[str]:
    return sorted(str(p.relative_to(top)) for p in top.rglob("*") if p.is_file() and not p.is_symlink())


def _guarded(rel: str, patterns: tuple[str, ...]) -> bool:
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


def _put(src: Path, workspace: Path, rel: str) -> None:
    _clear(workspace, rel)
    copy_without_privileges(src, workspace / rel)


def _clear(workspace: Path, rel: str) -> None:
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
