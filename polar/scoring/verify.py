"""The ground a verifier stands on (docs/design.md §10, docs/tasks.md "Verification"): nothing the agent wrote may
decide its reward.

After the harness exited and its sandbox is gone, `prepare_verify` builds `<sample>/verify/`: the task's
**pristine** workspace with only the agent's allowed changes applied (`submit:`, polar/scoring/allow.py), the
task's own `tests:` staged over it, and a fresh HOME. The evaluator then runs there, in a new sandbox. Every
change the agent made outside the allowlist, and the Python start-up hooks it left in its HOME, come back as
`tampered`; changes that reach for the verifier (process exit, atexit, pytest internals, import hooks, compiled
files: polar/scoring/suspicious.py) as `suspicious`, kept or not. Both are the cheap, always-on sign of a policy
going for the verifier instead of the task.

`read_beneath` (polar/sandbox/agent_files.py, importable from here too) is how the host reads a file the agent
may have shaped: one directory at a time by descriptor, never through a symlink, regular files only, size-capped.
"""
from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from polar.sandbox import quota
from polar.sandbox.identity import copy_without_privileges
from polar.sandbox.runtime import Mounts
from polar.sandbox.agent_files import AgentFileError, AgentFileMissing, clear_path, read_beneath
from polar.scoring.allow import apply_submission, shown
from polar.scoring.suspicious import scan_changes
from polar.tasks.task import LOGS_AT, TESTS_AT, TaskSpec

__all__ = ["AgentFileError", "AgentFileMissing", "VerifyGround", "home_hooks", "prepare_verify", "read_beneath"]

HOME_HOOKS = ("usercustomize.py", "sitecustomize.py")  # run by any python that sees a user site
HOOK_SUFFIXES = (".pth",)  # lines starting with `import` run at start-up from a site-packages folder
LISTED = 100  # dropped changes named one by one at most (an agent may leave a million files)


@dataclass(frozen=True)
class VerifyGround:
    mounts: Mounts  # the verifier's HOME, workspace (pristine + allowed changes + tests) and an empty socket folder
    tampered: tuple[str, ...]  # agent changes dropped (workspace paths), and ~/… start-up hooks
    suspicious: tuple[str, ...] = ()  # "PATH: WHAT" for changes that reach for the verifier (suspicious.py)
    notes: tuple[str, ...] = ()  # why the first dropped changes were dropped, and the task line that admits one


def prepare_verify(task: TaskSpec, out: Path, before: dict[str, str], after: dict[str, str],
                   disk_mb: int | None = None) -> VerifyGround:
    """Build `out/verify` from the task's pristine workspace and the agent's final one, `out/workspace`.
    `before` and `after` are the workspace's snapshots (relative path -> digest) at the harness's start and end:
    a path alike in both was not the agent's doing (a file the harness wrote), so it is left out unnamed.
    `disk_mb`: the sample's disk quota; the ground then gets a disk of its own, room for the pristine workspace
    and that much of the agent's changes (polar/sandbox/quota.py)."""
    root, disk = out / "verify", out / quota.VERIFY_DISK
    quota.remove_disk(disk, (("ground", root),), keep=False)  # a retried stage starts from the pristine workspace
    shutil.rmtree(root, ignore_errors=True)
    if disk_mb:
        quota.make_disk(disk, disk_mb + quota.tree_mb(task.workspace) + quota.SLACK_MB, (("ground", root),))
    workspace, home, shared = root / "workspace", root / "home", root / "shared"
    for d in (home / ".tmp", shared):
        d.mkdir(parents=True)
    harbor = task.evaluator.kind == "harbor"  # its tests go to /tests, its reward to /logs (not the workspace)
    staged = _files_under(task.tests) if task.tests and not harbor else []
    untouched = {p for p, digest in before.items() if after.get(p) == digest}
    submission = apply_submission(task, out / "workspace", workspace, staged, untouched)
    for rel in staged:
        _put(task.tests / rel, workspace, rel)
    (shared / "owned.txt").write_text("".join(f"{rel}\n" for rel in staged))  # trusted by the runner's guards
    dropped = list(submission.dropped)
    if len(dropped) > LISTED:
        dropped = [*dropped[:LISTED], f"... and {len(dropped) - LISTED} more"]
    hooks = [f"~/{shown(p)}" for p in home_hooks(out / "home")]
    suspicious = scan_changes(out / "workspace", submission) + [f"{h}: Python start-up hook" for h in hooks]
    binds, ro_binds = _harbor_binds(task, root) if harbor else ((), ())
    return VerifyGround(Mounts(home, workspace, shared, binds, ro_binds, task.workdir), tuple(dropped + hooks),
                        tuple(suspicious), submission.notes)


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


def _files_under(top: Path) -> list[str]:
    return sorted(str(p.relative_to(top)) for p in top.rglob("*") if p.is_file() and not p.is_symlink())


def _put(src: Path, workspace: Path, rel: str) -> None:
    clear_path(workspace, rel)
    copy_without_privileges(src, workspace / rel)


