"""Where a task's inputs may come from (docs/tasks.md "Tasks root").

A task set is data from elsewhere (a downloaded dataset): its `workspace`, `tests` and Harbor folders must lie
under the tasks root the operator chose, never anywhere on the host (`../host-secret`, `/etc`), and no link may
lead out of it. The root is `--tasks-root`, else POLAR_TASKS_ROOT, else the task file's own folder (a Harbor
task directory or folder of them: itself) and the current directory (unless that is `/`). An adapter YAML named
by path over the API must lie under the adapters root (POLAR_ADAPTERS_ROOT, default the checkout's adapters/).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

TASKS_ROOT_ENV = "POLAR_TASKS_ROOT"
ADAPTERS_ROOT_ENV = "POLAR_ADAPTERS_ROOT"
DEFAULT_ADAPTERS_ROOT = Path(__file__).resolve().parents[2] / "adapters"
WIDEN = f"--tasks-root or {TASKS_ROOT_ENV} names another"


def tasks_roots(task_path: str | Path, explicit: str | Path | Sequence[str | Path] | None = None
                ) -> tuple[Path, ...]:
    """The folders a task file's inputs may resolve under, resolved (links followed once, here, by Polar)."""
    if explicit is not None and not isinstance(explicit, (str, Path)):
        return tuple(Path(p).resolve() for p in explicit)
    chosen = explicit or os.environ.get(TASKS_ROOT_ENV) or None
    if chosen:
        return (Path(chosen).resolve(),)
    path = Path(task_path).resolve()
    own = path if path.is_dir() else path.parent
    cwd = Path.cwd().resolve()
    return (own,) if cwd == Path("/") or cwd == own else (own, cwd)


def adapters_root() -> Path:
    return Path(os.environ.get(ADAPTERS_ROOT_ENV) or DEFAULT_ADAPTERS_ROOT).resolve()


def inside(path: Path, roots: Sequence[Path]) -> bool:
    """Whether `path`, every link in it followed, lies under one of `roots` (already resolved)."""
    real = Path(path).resolve()
    return any(real.is_relative_to(root) for root in roots)


def roots_text(roots: Sequence[Path]) -> str:
    return " or ".join(str(r) for r in roots)


def outside(value: str, roots: Sequence[Path]) -> str:
    """The problem, in one line, of a path that leaves the tasks root."""
    return f"{value!r} is outside the tasks root {roots_text(roots)} ({WIDEN})"
