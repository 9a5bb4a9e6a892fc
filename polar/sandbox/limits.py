"""Per-sandbox resource limits (memory, processes; wall time is exec's timeout) and reaping what is left.

Where Polar may create cgroups, each sandbox gets its own, entered by the sandbox's first process before it
execs, so everything the harness starts is counted and can be killed at the end, whatever session or process
group it moved to:
  v1  the `pids` and `memory` hierarchies (these VMs: a hybrid v1 mount, root may mkdir under its own cgroup);
  v2  a child of our own cgroup, when `pids` and `memory` are enabled for children there.
Otherwise the limits fall back to rlimits set with `prlimit` (RLIMIT_NPROC, RLIMIT_DATA). Measured here:
RLIMIT_NPROC does not bound root at all (the kernel exempts real uid 0, also inside a user namespace with
another mapped uid), and root's sandboxes all run as the one polar-sandbox uid (identity.py), where RLIMIT_NPROC
would count every sample's threads on the node together: so a root without cgroups sets none and has no process
bound; RLIMIT_DATA bounds each process's heap,
not the sandbox's total (RLIMIT_AS would break node, whose V8 and WebAssembly reserve large address ranges).
"""
from __future__ import annotations

import os
import shutil
import signal
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

CONTROLLERS = ("pids", "memory")


@dataclass(frozen=True)
class Limits:
    """What one sandbox may use. Threads count as processes (both cgroups and RLIMIT_NPROC count tasks)."""

    memory_bytes: int = 4 << 30
    processes: int = 1024
    file_bytes: int = 4 << 30  # RLIMIT_FSIZE: the largest file a sandbox process may write or fallocate
    cpus: float | None = None  # CPU share, where the runtime can bound it (docker --cpus); None: its default

    def __post_init__(self) -> None:
        if self.memory_bytes < 16 << 20 or self.processes < 8 or self.file_bytes < 1 << 20:
            raise ValueError(f"limits too small to start anything: {self}")


DEFAULT_LIMITS = Limits()


def _mounts() -> list[tuple[str, Path, set[str]]]:
    """(fstype, mount point, options) of the cgroup file systems we see."""
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields, _, tail = line.partition(" - ")
        fstype, _source, options = (tail.split() + ["", ""])[:3]
        if fstype in ("cgroup", "cgroup2"):
            found.append((fstype, Path(fields.split()[4]), set(options.split(","))))
    return found


def _own_paths() -> dict[str, str]:
    """controller (or "" for v2) -> our cgroup path, from /proc/self/cgroup."""
    paths = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _id, controllers, path = line.split(":", 2)
        for c in controllers.split(",") if controllers else [""]:
            paths[c] = path
    return paths


def _write(path: Path, value: str) -> None:
    path.write_text(value)


def _make_v1(name: str, limits: Limits) -> list[Path] | None:
    own = _own_paths()
    dirs = []
    for controller in CONTROLLERS:
        mount = next((m for fs, m, opts in _mounts() if fs == "cgroup" and controller in opts), None)
        if mount is None or controller not in own:
            return _undo(dirs)
        d = mount / own[controller].lstrip("/") / name
        try:
            d.mkdir()
            dirs.append(d)
            if controller == "pids":
                _write(d / "pids.max", str(limits.processes))
            else:
                _write(d / "memory.limit_in_bytes", str(limits.memory_bytes))
                if (d / "memory.memsw.limit_in_bytes").exists():
                    _write(d / "memory.memsw.limit_in_bytes", str(limits.memory_bytes))
        except OSError:
            return _undo(dirs)
    return dirs


def _make_v2(name: str, limits: Limits) -> list[Path] | None:
    mount = next((m for fs, m, _o in _mounts() if fs == "cgroup2"), None)
    own = _own_paths().get("")
    if mount is None or own is None:
        return None
    parent = mount / own.lstrip("/")
    try:
        enabled = (parent / "cgroup.subtree_control").read_text().split()
    except OSError:
        return None
    if not set(CONTROLLERS) <= set(enabled):
        return None
    d = parent / name
    try:
        d.mkdir()
        _write(d / "pids.max", str(limits.processes))
        _write(d / "memory.max", str(limits.memory_bytes))
        if (d / "memory.swap.max").exists():
            _write(d / "memory.swap.max", "0")
    except OSError:
        return _undo([d] if d.exists() else [])
    return [d]


def _undo(dirs: list[Path]) -> None:
    for d in dirs:
        try:
            d.rmdir()
        except OSError:
            pass
    return None


class Cgroup:
    """One sandbox's cgroup (one directory per v1 controller, one for v2)."""

    def __init__(self, dirs: list[Path], version: int) -> None:
        self.dirs, self.version = dirs, version

    @property
    def mechanism(self) -> str:
        return f"cgroup v{self.version} (pids, memory)"

    def wrap(self, cmd: list[str]) -> list[str]:
        """`cmd` run by a shell that first moves itself into the cgroup(s), so all its descendants are in it."""
        enter = " && ".join(f'echo $$ > "${i + 1}"' for i in range(len(self.dirs)))
        procs = [str(d / "cgroup.procs") for d in self.dirs]
        return ["sh", "-c", f'{enter} && shift {len(procs)} && exec "$@"', "polar-limits", *procs, *cmd]

    def pids(self) -> set[int]:
        found: set[int] = set()
        for d in self.dirs:
            try:
                found |= {int(p) for p in (d / "cgroup.procs").read_text().split()}
            except OSError:
                pass
        return found

    def peak_processes(self) -> int | None:
        for d in self.dirs:
            f = d / "pids.peak"
            if f.exists():
                return int(f.read_text())
        return None

    def kill_all(self, deadline_s: float = 10.0) -> int:
        """SIGKILL every process left in the cgroup until none is; returns how many were killed."""
        killed: set[int] = set()
        end = time.monotonic() + deadline_s
        while (pids := self.pids()) and time.monotonic() < end:
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                    killed.add(pid)
                except ProcessLookupError:
                    pass
            time.sleep(0.02)
        return len(killed)

    def remove(self) -> None:
        self.kill_all()
        for d in self.dirs:
            for _ in range(50):
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.05)


def make_cgroup(limits: Limits) -> Cgroup | None:
    """A fresh cgroup with these limits, or None where Polar may not create one here."""
    name = f"polar-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        if (dirs := _make_v2(name, limits)) is not None:
            return Cgroup(dirs, 2)
        if (dirs := _make_v1(name, limits)) is not None:
            return Cgroup(dirs, 1)
    except OSError:
        pass
    return None


def rlimit_wrap(cmd: list[str], limits: Limits, in_cgroup: bool = False) -> list[str]:
    """Per-process rlimits set by `prlimit`: always the file size; memory and processes too where no cgroup
    bounds them (the fallback; see the module docstring for what they bound)."""
    prlimit = shutil.which("prlimit")
    if prlimit is None:
        return cmd
    fallback = [] if in_cgroup else [f"--data={limits.memory_bytes}"]
    if not in_cgroup and os.geteuid() != 0:
        fallback.insert(0, f"--nproc={limits.processes}")
    return [prlimit, f"--fsize={limits.file_bytes}", *fallback, "--", *cmd]


def mechanism() -> str:
    """What bounds a sandbox here, in words (a probe: creates and removes one cgroup)."""
    cgroup = make_cgroup(DEFAULT_LIMITS)
    if cgroup is not None:
        cgroup.remove()
        return cgroup.mechanism
    if os.geteuid() == 0:
        return "rlimits (RLIMIT_DATA per process; no process bound: the sandbox uid is shared by every sample)"
    return "rlimits (RLIMIT_NPROC per uid, RLIMIT_DATA per process)"
