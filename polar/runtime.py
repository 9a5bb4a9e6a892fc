"""Runtimes: where a harness runs. A small protocol (prepare, exec, copy in/out, stop) with two implementations
that both give the harness a network namespace holding only loopback (DESIGN.md §6):

  local  `unshare` (net + pid namespaces) on the host filesystem; `ip link set lo up` inside.
  bwrap  bubblewrap: `--unshare-net --unshare-pid`, read-only root, writable HOME and workspace only.

Either way the proxy is reached through unix sockets bind-visible in the sandbox and the in-sandbox TCP
forwarder of polar/bridge.py, which listens on the same port numbers as the proxy on the host.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Protocol, Sequence

from polar import bridge

PROJECT_ROOT = Path(__file__).resolve().parents[1]

RUNTIMES = ("local", "bwrap")


class SandboxError(RuntimeError):
    pass


@dataclass(frozen=True)
class Mounts:
    """Host directories the sandbox sees, writable, at the same paths."""

    home: Path
    workspace: Path
    shared: Path  # sockets to the proxy and the CA files


@dataclass(frozen=True)
class ExecResult:
    exit_code: int
    timed_out: bool
    wall_s: float


class Sandbox(Protocol):
    def exec(self, argv: Sequence[str], env: Mapping[str, str], cwd: Path, timeout_s: float,
             stdout: Path, stderr: Path, forwards: Sequence[tuple[int, Path]] = ()) -> ExecResult: ...
    def copy_in(self, src: Path, dst: Path) -> None: ...
    def copy_out(self, src: Path, dst: Path) -> None: ...
    def stop(self) -> None: ...


class Runtime(Protocol):
    name: str

    def prepare(self, mounts: Mounts) -> Sandbox: ...


def bridged(argv: Sequence[str], forwards: Sequence[tuple[int, Path]]) -> list[str]:
    """argv run behind the in-sandbox forwarder (stdlib only, so any python3 with the file visible works)."""
    fwd = [a for port, path in forwards for a in ("--forward", f"{port}={path}")]
    return [sys.executable, "-I", bridge.__file__, *fwd, "--", *argv]


def _copy(src: Path, dst: Path) -> None:
    if src.is_dir():
        shutil.copytree(src, dst, symlinks=True, dirs_exist_ok=True)
    else:
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dst)


def run_group(cmd: Sequence[str], env: Mapping[str, str], cwd: Path, timeout_s: float,
              stdout: Path, stderr: Path) -> ExecResult:
    """Run in its own process group; on timeout TERM then KILL the whole group."""
    start = time.monotonic()
    with open(stdout, "wb") as out, open(stderr, "wb") as err:
        proc = subprocess.Popen(list(cmd), env=dict(env), cwd=cwd, stdin=subprocess.DEVNULL,
                                stdout=out, stderr=err, start_new_session=True)
        timed_out = False
        try:
            code = proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            code = _kill_group(proc)
        except BaseException:
            _kill_group(proc)
            raise
    return ExecResult(code, timed_out, round(time.monotonic() - start, 3))


def _kill_group(proc: subprocess.Popen) -> int:
    for sig, grace in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            return proc.wait(grace)
        except subprocess.TimeoutExpired:
            continue
    return proc.wait()


class _HostSandbox:
    """Both runtimes here share the host filesystem: copying in and out is a plain copy."""

    def __init__(self, mounts: Mounts) -> None:
        self.mounts = mounts

    def copy_in(self, src: Path, dst: Path) -> None:
        _copy(src, dst)

    def copy_out(self, src: Path, dst: Path) -> None:
        _copy(src, dst)

    def stop(self) -> None:
        """Nothing outlives exec: the pid namespace dies with its first process."""


class LocalSandbox(_HostSandbox):
    def __init__(self, mounts: Mounts, ip: str) -> None:
        super().__init__(mounts)
        self.ip = ip

    def exec(self, argv: Sequence[str], env: Mapping[str, str], cwd: Path, timeout_s: float,
             stdout: Path, stderr: Path, forwards: Sequence[tuple[int, Path]] = ()) -> ExecResult:
        # root: plain namespaces; otherwise a user namespace mapping us to root inside.
        ns = ["unshare", "--net", "--pid", "--fork", "--kill-child"]
        if os.geteuid() != 0:
            ns.insert(1, "--map-root-user")
        inner = ["sh", "-c", '"$0" link set lo up && exec "$@"', self.ip, *bridged(argv, forwards)]
        return run_group(ns + inner, env, cwd, timeout_s, stdout, stderr)


class LocalRuntime:
    name = "local"

    def prepare(self, mounts: Mounts) -> Sandbox:
        if not shutil.which("unshare"):
            raise SandboxError("local runtime: `unshare` (util-linux) not found")
        ip = shutil.which("ip", path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin")
        if not ip:
            raise SandboxError("local runtime: `ip` (iproute2) not found")
        return LocalSandbox(mounts, ip)


class BwrapSandbox(_HostSandbox):
    def __init__(self, mounts: Mounts, bwrap: str) -> None:
        super().__init__(mounts)
        self.bwrap = bwrap

    def command(self, cwd: Path) -> list[str]:
        cmd = [self.bwrap, "--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts",
               "--die-with-parent", "--new-session", "--ro-bind", "/", "/", "--dev", "/dev",
               "--proc", "/proc", "--tmpfs", "/tmp"]
        for d in _under_tmp(PROJECT_ROOT, Path(sys.prefix)):
            cmd += ["--ro-bind", str(d), str(d)]  # a checkout or venv under /tmp stays visible past the tmpfs
        for d in (self.mounts.home, self.mounts.workspace, self.mounts.shared):
            cmd += ["--bind", str(d), str(d)]
        return cmd + ["--chdir", str(cwd)]

    def exec(self, argv: Sequence[str], env: Mapping[str, str], cwd: Path, timeout_s: float,
             stdout: Path, stderr: Path, forwards: Sequence[tuple[int, Path]] = ()) -> ExecResult:
        return run_group(self.command(cwd) + ["--", *bridged(argv, forwards)], env, cwd, timeout_s, stdout, stderr)


def _under_tmp(*paths: Path) -> list[Path]:
    found = []
    for p in paths:
        p = p.resolve()
        if p.is_relative_to("/tmp") and p != Path("/tmp") and not any(p.is_relative_to(f) for f in found):
            found.append(p)
    return found


class BwrapRuntime:
    name = "bwrap"

    def prepare(self, mounts: Mounts) -> Sandbox:
        bwrap = shutil.which("bwrap")
        if not bwrap:
            raise SandboxError("bwrap runtime: `bwrap` (bubblewrap) not found")
        return BwrapSandbox(mounts, bwrap)


def get_runtime(name: str) -> Runtime:
    if name == "local":
        return LocalRuntime()
    if name == "bwrap":
        return BwrapRuntime()
    raise ValueError(f"unknown runtime {name!r}; expected one of {RUNTIMES}")
