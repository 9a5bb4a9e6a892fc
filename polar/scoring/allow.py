"""The allowlist (issue 40, docs/tasks.md "submit"): the verifier never stands on what the agent left, only on the
task's own pristine workspace with the agent's allowed changes applied to it.

A change is allowed when its path matches the task's `submit` globs (or, with `existing`, names a file the
pristine workspace holds; or, with `new`, is a new text file with a UTF-8 name, not named like the standard
library's modules), is not protected, not one of the task's staged `tests:` files, and not pytest's configuration,
a Python start-up hook or a repository's hooks or config (those only when a glob names that exact path). A task
without `submit` takes the changes its oracle made (polar/scoring/oracle.py), else DEFAULT_SUBMIT (existing and
new). What comes in is regular files only, read
without following links: no symlink, FIFO, device or socket; an executable bit only on a new file the agent made
executable or where `executable` globs allow one; no compiled or binary file (.so, .pyc, ELF, NUL bytes) unless
`binary` and a glob or `existing` admits it. Deleting an allowed file is a change like any other. Every other
change is dropped and named.
"""
from __future__ import annotations

import os
import stat
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from polar.sandbox.agent_files import clear_path, matches_any
from polar.tasks.task import Submit, TaskSpec
from polar.tasks.workspace import pristine

# Never the agent's: pytest reads them before any test, Python runs them at start-up.
NEVER_NAMES = frozenset({"conftest.py", "pytest.ini", ".pytest.ini", "tox.ini", "setup.cfg", "pyproject.toml",
                         "sitecustomize.py", "usercustomize.py"})
NEVER_SUFFIXES = (".pth",)
COMPILED_SUFFIXES = (".so", ".pyc", ".pyo", ".pyd", ".dll", ".dylib", ".o", ".a")
FILE_LIMIT = 16 << 20  # bytes of one submitted file at most; a larger one is dropped
NOTED = 5  # dropped files explained one by one at most
SHADOWED = frozenset(sys.stdlib_module_names) | {"pytest", "_pytest", "pluggy", "py"}  # never a new module's name


@dataclass(frozen=True)
class Submission:
    changes: tuple[str, ...]  # every path the agent changed, added or removed (shown names)
    applied: tuple[str, ...]  # taken into the verify workspace (written or deleted)
    dropped: tuple[str, ...]  # left out: outside the allowlist, or refused for its kind
    compiled: tuple[str, ...]  # compiled or binary files among the changes, taken or not
    notes: tuple[str, ...] = ()  # for the first dropped files: why, and how the task would let it in


def shown(rel: str) -> str:
    """A path as text that every writer takes: a name that is not UTF-8 gets backslash escapes."""
    return rel.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def apply_submission(task: TaskSpec, final: Path, dest: Path, staged: Iterable[str] = (),
                     untouched: Iterable[str] = ()) -> Submission:
    """Fill `dest` (not there yet) with the task's pristine workspace, then apply the agent's allowed changes from
    `final`. `staged`: the task's test files (they win); `untouched`: paths alike at the harness's start and end
    (one that differs from the pristine workspace was not the agent's doing, e.g. a file the harness wrote: it
    is left out, unnamed)."""
    pristine(task.workspace, dest)
    base, left = entries(dest), entries(final)
    staged, untouched, submit = set(staged), set(untouched), task.allowed
    changes, applied, dropped, compiled, notes = [], [], [], [], []
    for rel in sorted(set(base) | set(left)):
        b, f = base.get(rel), left.get(rel)
        if (b and f and same_file(dest / rel, final / rel, b, f)) or rel in untouched:
            continue
        changes.append(rel)
        if f is not None and stat.S_ISREG(f.st_mode) and _compiled(final / rel, rel, f):
            compiled.append(rel)
        refused = rel in compiled and not _binary_ok(rel, b, submit)
        if not allowed(rel, b is not None and stat.S_ISREG(b.st_mode), submit, task.protected, staged):
            dropped.append(rel)
        elif f is None:
            clear_path(dest, rel)
            applied.append(rel)
        elif _take(final, dest, rel, f, b, submit, refused):
            applied.append(rel)
        else:
            dropped.append(rel)
        if dropped and dropped[-1] == rel and len(notes) < NOTED:
            notes.append(drop_note(task, shown(rel), rel in staged or matches_any(rel, task.protected), f, refused))
    return Submission(*(tuple(map(shown, x)) for x in (changes, applied, dropped, compiled)), tuple(notes))


def drop_note(task: TaskSpec, rel: str, owned: bool, f: os.stat_result | None, compiled: bool) -> str:
    """`run.py dropped: not in this task's allowlist; add [polar] submit = ["run.py"] to task.toml`: why a change
    did not reach the verifier, and the line of the task's own file that would let it in."""
    harbor = task.evaluator.kind == "harbor"
    if owned:
        return f"{rel} dropped: the task's own file (protected or one of its tests): the agent's version never counts"
    if f is not None and not stat.S_ISREG(f.st_mode):
        return f"{rel} dropped: not a regular file (a link or a special file): only regular files reach the verifier"
    if f is not None and f.st_size > FILE_LIMIT:
        return f"{rel} dropped: larger than {FILE_LIMIT >> 20} MiB, the most one submitted file may hold"
    why = "a compiled or binary file" if compiled else "not in this task's allowlist"
    if harbor:
        fix = (f'add [polar.submit] files = ["{rel}"] and binary = true to task.toml' if compiled else
               f'add [polar] submit = ["{rel}"] to task.toml')
    else:
        fix = f"add submit: {{files: [{rel}], binary: true}} to the task" if compiled else \
            f"add submit: [{rel}] to the task"
    return f"{rel} dropped: {why}; {fix}"


def allowed(rel: str, existed: bool, submit: Submit, protected: tuple[str, ...], staged: set[str]) -> bool:
    if rel in staged or matches_any(rel, protected):
        return False
    name = rel.rsplit("/", 1)[-1]
    if name in NEVER_NAMES or name.endswith(NEVER_SUFFIXES) or _git_runs(rel):
        return rel in submit.globs  # only where the task names that very path
    if matches_any(rel, submit.globs) or (submit.existing and existed):
        return True
    return submit.new and not existed and not shadows(rel) and _utf8(rel)


def _utf8(rel: str) -> bool:
    """A name that is UTF-8 (os.walk gives other bytes as lone surrogates): `new` admits honest file names only."""
    try:
        rel.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _git_runs(rel: str) -> bool:
    """A repository's hooks and config: git runs what they name (a hook, core.fsmonitor) in whoever calls it."""
    parts = rel.split("/")
    return any(p == ".git" and (parts[i + 1:i + 2] == ["hooks"] or parts[i + 1:] == ["config"])
               for i, p in enumerate(parts[:-1]))


def shadows(rel: str) -> bool:
    """A new module or package named like the standard library's or pytest's: `json.py`, `pytest/__init__.py`
    (a verifier run from the workspace, as a Harbor test.sh may be, would import it instead)."""
    top = rel.split("/", 1)[0]
    stem = top[:-3] if top.endswith(".py") and "/" not in rel else top
    return stem in SHADOWED and (top.endswith(".py") or "/" in rel)


def entries(root: Path) -> dict[str, os.stat_result]:
    """relative path -> lstat of everything under root but real folders (a link to a folder is an entry);
    nothing is followed, an unreadable folder is skipped."""
    found: dict[str, os.stat_result] = {}
    for dirpath, dirs, files in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root)
        for name in [*files, *dirs]:
            rel = name if rel_dir == "." else f"{rel_dir}/{name}"
            try:
                st = os.lstat(os.path.join(dirpath, name))
            except OSError:
                continue
            if not stat.S_ISDIR(st.st_mode):
                found[rel] = st
    return found


def same_file(a: Path, b: Path, sa: os.stat_result, sb: os.stat_result) -> bool:
    """Two regular files with the same bytes (holes read as zeros), or two links to the same target."""
    if not (stat.S_ISREG(sa.st_mode) and stat.S_ISREG(sb.st_mode)) or sa.st_size != sb.st_size:
        return stat.S_ISLNK(sa.st_mode) and stat.S_ISLNK(sb.st_mode) and os.readlink(a) == os.readlink(b)
    with open(a, "rb") as fa, open(b, "rb", opener=_nofollow) as fb:
        # Only where either file holds data: a hole in both reads as zeros in both. A task's 64 GiB sparse file
        # is compared in no time (reading its holes took minutes of system time).
        for start, end in _merged(_extents(fa.fileno(), sa.st_size) + _extents(fb.fileno(), sb.st_size)):
            while start < end:
                n = min(end - start, 1 << 20)
                x, y = os.pread(fa.fileno(), n, start), os.pread(fb.fileno(), n, start)
                if x != y:
                    return False
                if not x:
                    break
                start += len(x)
    return True


def _extents(fd: int, size: int) -> list[tuple[int, int]]:
    """The file's data extents [start, end) by SEEK_DATA/SEEK_HOLE (a file system without holes: all of it)."""
    out, pos = [], 0
    while pos < size:
        try:
            start = os.lseek(fd, pos, os.SEEK_DATA)
        except OSError:
            break  # ENXIO: nothing but a hole from pos on
        pos = os.lseek(fd, start, os.SEEK_HOLE)
        out.append((start, pos))
    return out


def _merged(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for start, end in sorted(spans):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def _nofollow(path: str, flags: int) -> int:
    return os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK)


def _compiled(path: Path, rel: str, st: os.stat_result) -> bool:
    """A compiled or binary file: by its name, or an ELF header or a NUL byte in its first MiB."""
    if rel.endswith(COMPILED_SUFFIXES) or "/__pycache__/" in f"/{rel}":
        return True
    try:
        with open(path, "rb", opener=_nofollow) as f:
            head = f.read(1 << 20)
    except OSError:
        return False
    return head.startswith(b"\x7fELF") or b"\0" in head


def _binary_ok(rel: str, b: os.stat_result | None, submit: Submit) -> bool:
    """A compiled or binary file comes in only with `binary`, where the globs name it or over a file the task had
    (never through `new`, which admits text)."""
    return submit.binary and (matches_any(rel, submit.globs) or (submit.existing and b is not None))


def _take(final: Path, dest: Path, rel: str, f: os.stat_result, b: os.stat_result | None, submit: Submit,
          refused: bool) -> bool:
    """Copy one allowed file in; False when its kind refuses it (a link, a special file, too large, a compiled
    file not allowed)."""
    if not stat.S_ISREG(f.st_mode) or f.st_size > FILE_LIMIT or refused:
        return False
    if (dest / rel).is_dir() and not (dest / rel).is_symlink():  # a folder of the task's there: it stays
        return False
    try:
        with open(final / rel, "rb", opener=_nofollow) as src:
            data = src.read(FILE_LIMIT + 1)
    except OSError:
        return False
    had = b if b is not None and stat.S_ISREG(b.st_mode) else None
    # The task's file keeps the task's mode unless the task lets it become executable; a new file keeps the agent's.
    executable = (had is not None and had.st_mode & 0o100) or (
        f.st_mode & 0o100 and (had is None or matches_any(rel, submit.executable)))
    clear_path(dest, rel)  # every folder on the way a real folder, nothing at rel itself
    target = dest / rel
    target.write_bytes(data)
    os.chmod(target, 0o755 if executable else 0o644)  # never a setuid, setgid or sticky bit
    return True
