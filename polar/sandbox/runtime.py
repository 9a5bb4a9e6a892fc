"""Runtimes: where a harness runs. A small protocol (prepare, exec, copy in/out, stop). Every runtime gives the
harness a network namespace holding only loopback (docs/design.md §6) and a pid namespace, bounds its memory and
processes (polar/sandbox/limits.py; wall time is exec's timeout) and reaps whatever it leaves behind.

  auto   the default: the most isolated runtime installed (for a task that names an image: apptainer for a SIF
         or sandbox directory, the container engine for an OCI image or tarball; else bwrap)
  bwrap  bubblewrap: a minimal read-only view of the host (system directories, a few /etc files, node and the
         harness CLIs), the session's HOME, workspace and socket directory writable, private /tmp, /proc and
         /dev, /proc/sys read-only, no /sys; no other host path (not the checkout, not the host user's home,
         not other runs' folders). Started by root, bwrap sets up the view and its first process drops to the
         unprivileged polar-sandbox user (polar/sandbox/identity.py); started by a user, it runs in a user
         namespace of that user, as before
  docker podman or docker: one container per sandbox (polar/sandbox/docker.py), the same promises as apptainer
  local  explicit opt-in: `unshare` (net + pid namespaces) on the host filesystem, which the harness can read
         and write; it says so in one warning line

No isolated sandbox process is the host's uid 0; setuid/setgid bits are cleared from the writable folders after
each exec (identity.py). Either way the proxy is reached through unix sockets visible in the sandbox and the
in-sandbox TCP forwarder of polar/sandbox/bridge.py, which listens on the same port numbers as the proxy on the
host; bwrap started by root runs in a namespace of loopback only that the node made, the node itself listening
there (netns.py).
"""
from __future__ import annotations

import hashlib
import importlib
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from stat import S_ISDIR
from typing import Callable, Mapping, Protocol, Sequence

from polar.sandbox import bridge, netns, seccomp, supervisor
from polar.sandbox.capture import CappedCopy
from polar.sandbox.identity import Identity, copy_without_privileges, drop_privilege_bits, hand_over, sandbox_identity
from polar.sandbox.limits import DEFAULT_LIMITS, Limits, make_cgroup, rlimit_wrap
from polar_traj.atomic import made_once

PROJECT_ROOT = Path(__file__).resolve().parents[2]

# name -> "module:Class" (constructed with no argument, or limits=…); a runtime registers with one line here.
REGISTRY: dict[str, str] = {
    "local": "polar.sandbox.runtime:LocalRuntime",
    "bwrap": "polar.sandbox.runtime:BwrapRuntime",
    "apptainer": "polar.sandbox.apptainer:ApptainerRuntime",
    "docker": "polar.sandbox.docker:DockerRuntime",
}
RUNTIMES = ("auto", *REGISTRY)
LOCAL_WARNING = ("polar: runtime local: the harness runs on the host filesystem and can read and write the "
                 "host's files (the default runtime, auto, isolates it)")


class SandboxError(RuntimeError):
    pass


@dataclass(frozen=True)
class Mounts:
    """Host directories the sandbox sees, writable, at the same paths."""

    home: Path
    workspace: Path
    shared: Path  # sockets to the proxy and the CA files
    # Writable host directories seen at another path (host dir, sandbox path): a Harbor verifier's /logs
    # (polar/tasks/harbor.py). The local runtime has no view of its own, so it refuses them and ro_binds.
    binds: tuple[tuple[Path, str], ...] = ()
    # The same, read-only for every process of the sandbox: a Harbor verifier's /tests, which the agent's code
    # that the tests import would otherwise rewrite under test.sh (bash reads a script as it runs it).
    ro_binds: tuple[tuple[Path, str], ...] = ()
    # Where the sandbox sees the workspace instead of its host path: a task's workdir (`/app`) over its image.
    workdir: str | None = None
    # The image's root writable, a copy of its own removed with the sandbox (docker, apptainer; bwrap's root is
    # the host's and stays read-only): the verifier of a task that installs what its tests need (apt-get).
    root_writable: bool = False

    @property
    def cwd(self) -> Path:
        """The workspace as the sandbox sees it: where the harness and the verifier start."""
        return Path(self.workdir) if self.workdir else self.workspace

    def own(self) -> tuple[tuple[Path, str], ...]:
        """(host folder, sandbox path) of HOME, the workspace and the socket folder, all writable."""
        return ((self.home, str(self.home)), (self.workspace, str(self.cwd)), (self.shared, str(self.shared)))


@dataclass(frozen=True)
class ExecResult:
    exit_code: int
    timed_out: bool
    wall_s: float
    reaped: int = 0  # processes still alive in the sandbox's cgroup when its first process ended, killed then


class Sandbox(Protocol):
    name: str | None  # what a later stage attaches to (an apptainer instance); None: nothing outlives exec

    def exec(self, argv: Sequence[str], env: Mapping[str, str], cwd: Path, timeout_s: float,
             stdout: Path, stderr: Path, forwards: Sequence[tuple[int, Path]] = ()) -> ExecResult: ...
    def copy_in(self, src: Path, dst: Path) -> None: ...
    def copy_out(self, src: Path, dst: Path) -> None: ...
    def stop(self) -> None: ...


class Runtime(Protocol):
    name: str

    def prepare(self, mounts: Mounts, image: str | None = None, instance: str | None = None) -> Sandbox:
        """A sandbox over `mounts` (of `image`, named `instance`, for runtimes that run images)."""
        ...

    def attach(self, mounts: Mounts, image: str | None, instance: str | None) -> Sandbox:
        """The sample's sandbox again, in a later stage (maybe another process): `instance` is prepare's `name`."""
        ...


def bridged(argv: Sequence[str], forwards: Sequence[tuple[int, Path]], python: str = sys.executable,
            script: str = bridge.__file__) -> list[str]:
    """argv run behind the in-sandbox forwarder (stdlib only, so any python3 with the file visible works; -S: no
    site-packages to scan at its start)."""
    fwd = [a for port, path in forwards for a in ("--forward", f"{port}={path}")]
    return [python, "-I", "-S", script, *fwd, "--", *argv]


_copy = copy_without_privileges  # in and out of a sandbox: links kept as links, no setuid/setgid bits


def writable(mounts: Mounts) -> tuple[Path, ...]:
    """Every host folder the sandbox may write (handed to its identity, checked for setuid bits after)."""
    return (mounts.home, mounts.workspace, mounts.shared, *(src for src, _dst in mounts.binds))


def run_as(who: Identity | None, mounts: Mounts, cmd: Sequence[str], env: Mapping[str, str], cwd: Path,
           timeout_s: float, stdout: Path, stderr: Path, limits: Limits | None,
           pass_fds: Sequence[int] = ()) -> ExecResult:
    """run_group for an isolated sandbox whose processes run as `who` (None: as we are): its folders are
    handed to `who` first, and no file in them keeps a setuid/setgid bit afterwards."""
    if who is not None:
        hand_over(writable(mounts), who)
    try:
        return run_group(cmd, env, cwd, timeout_s, stdout, stderr, limits, pass_fds)
    finally:
        drop_privilege_bits(writable(mounts))


def run_group(cmd: Sequence[str], env: Mapping[str, str], cwd: Path, timeout_s: float,
              stdout: Path, stderr: Path, limits: Limits | None = DEFAULT_LIMITS,
              pass_fds: Sequence[int] = ()) -> ExecResult:
    """Run in its own process group (and cgroup, with `limits`); on timeout TERM then KILL the whole group;
    when it ends, kill whatever is left in its cgroup. Its stdout and stderr go to the files, capped
    (polar/sandbox/capture.py: head and tail kept). The group and the cgroup are registered with the run's
    watchdog (polar/sandbox/supervisor.py) while it runs, so a killed run leaves none of it."""
    start = time.monotonic()
    cgroup = make_cgroup(limits) if limits is not None else None
    if limits is not None:
        cmd = cgroup.wrap(rlimit_wrap(list(cmd), limits, True)) if cgroup else rlimit_wrap(list(cmd), limits)
    copies: list[CappedCopy] = []
    watches = [supervisor.watch_cgroup(cgroup.dirs)] if cgroup else []
    try:
        files = [open(stdout, "wb"), open(stderr, "wb")]
        # A revoke's SIGTERM that lands between the fork and the watch would leave the group running unwatched:
        # it waits until the group is watched, then is delivered where the group gets killed.
        resume_sigterm = _hold_sigterm()
        try:
            proc = subprocess.Popen(cmd, env=dict(env), cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, start_new_session=True, pass_fds=tuple(pass_fds))
        except BaseException:
            for f in files:
                f.close()
            resume_sigterm()
            raise
        watches.append(supervisor.watch_group(proc.pid))
        copies = [CappedCopy(proc.stdout, files[0]), CappedCopy(proc.stderr, files[1])]
        timed_out = False
        try:
            resume_sigterm()
            code = proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            code = _kill_group(proc)
        except BaseException:
            _kill_group(proc)
            raise
    finally:
        reaped = cgroup.kill_all() if cgroup else 0
        if cgroup:
            cgroup.remove()
        for watch in watches:
            watch.release()
        for copy in copies:
            copy.wait()
    return ExecResult(code, timed_out, round(time.monotonic() - start, 3), reaped)


def _hold_sigterm() -> Callable[[], None]:
    """Hold SIGTERM (only where a Python handler takes it, in the main thread) until the returned function runs;
    a SIGTERM that came meanwhile is raised again there, under the restored handler. (A blocked signal mask
    would be inherited by the child, so the handler is swapped instead.)"""
    previous = signal.getsignal(signal.SIGTERM)
    if not callable(previous) or threading.current_thread() is not threading.main_thread():
        return lambda: None
    held: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, frame: held.append(signum))

    def resume() -> None:
        signal.signal(signal.SIGTERM, previous)
        if held:
            signal.raise_signal(signal.SIGTERM)
    return resume


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

    name = None  # nothing outlives exec: a later stage prepares a fresh one

    def __init__(self, mounts: Mounts, limits: Limits) -> None:
        self.mounts, self.limits = mounts, limits

    def copy_in(self, src: Path, dst: Path) -> None:
        _copy(src, dst)

    def copy_out(self, src: Path, dst: Path) -> None:
        _copy(src, dst)

    def stop(self) -> None:
        """Nothing outlives exec: the pid namespace dies with its first process, the cgroup is emptied."""


class LocalSandbox(_HostSandbox):
    def __init__(self, mounts: Mounts, ip: str, limits: Limits) -> None:
        super().__init__(mounts, limits)
        self.ip = ip

    def exec(self, argv: Sequence[str], env: Mapping[str, str], cwd: Path, timeout_s: float,
             stdout: Path, stderr: Path, forwards: Sequence[tuple[int, Path]] = ()) -> ExecResult:
        # root: plain namespaces; otherwise a user namespace mapping us to root inside.
        ns = ["unshare", "--net", "--pid", "--fork", "--kill-child"]
        if os.geteuid() != 0:
            ns.insert(1, "--map-root-user")
        inner = ["sh", "-c", '"$0" link set lo up && exec "$@"', self.ip,
                 *(bridged(argv, forwards) if forwards else argv)]
        return run_group(ns + inner, env, cwd, timeout_s, stdout, stderr, self.limits)


class LocalRuntime:
    name = "local"

    def __init__(self, limits: Limits = DEFAULT_LIMITS) -> None:
        self.limits = limits

    def prepare(self, mounts: Mounts, image: str | None = None, instance: str | None = None) -> Sandbox:
        if mounts.binds or mounts.ro_binds or mounts.workdir:
            named = ', '.join(d for _s, d in (*mounts.binds, *mounts.ro_binds)) or f"the workdir {mounts.workdir}"
            raise SandboxError(f"local runtime: the task needs {named} inside the "
                               "sandbox, which the host filesystem cannot show; use --runtime bwrap|apptainer|docker")
        if not shutil.which("unshare"):
            raise SandboxError("local runtime: `unshare` (util-linux) not found")
        ip = shutil.which("ip", path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin")
        if not ip:
            raise SandboxError("local runtime: `ip` (iproute2) not found")
        print(LOCAL_WARNING, file=sys.stderr, flush=True)
        return LocalSandbox(mounts, ip, self.limits)

    def attach(self, mounts: Mounts, image: str | None, instance: str | None) -> Sandbox:
        return self.prepare(mounts)


# The host's system, read-only; symlinks (a merged /usr: /bin -> usr/bin) are recreated as the host has them.
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
# The /etc a harness needs: name resolution, users, TLS roots, alternatives, the dynamic loader, the time zone.
ETC_FILES = ("resolv.conf", "hosts", "passwd", "group", "nsswitch.conf", "host.conf", "gai.conf", "ssl/certs",
             "ssl/openssl.cnf", "ca-certificates.conf", "alternatives", "ld.so.cache", "ld.so.conf",
             "ld.so.conf.d", "localtime")
TOOLS = PROJECT_ROOT / ".tools"  # the harness CLIs (.tools/npm) and their own environments, read-only
BRIDGE_IN_SANDBOX = "/.polar/bridge.py"
SYSTEM_PYTHON = Path("/usr/bin/python3")  # runs the stdlib-only forwarder; a bound interpreter otherwise


def _visible(path: Path, roots: Sequence[str]) -> bool:
    return any(path.is_relative_to(r) for r in roots)


def system_view() -> list[str]:
    """bwrap arguments for the read-only system part of the view."""
    args: list[str] = []
    for d in SYSTEM_DIRS:
        p = Path(d)
        if p.is_symlink():
            args += ["--symlink", os.readlink(p), d]
        elif p.is_dir():
            args += ["--ro-bind", d, d]
    etc = etc_copy()
    if etc is not None:
        return args + ["--ro-bind", str(etc), "/etc"]
    files = [str(p) for name in ETC_FILES if (p := Path("/etc", name)).exists()]
    for d in _ancestors(files):  # /etc, /etc/ssl: open to an unprivileged first process
        args += ["--perms", "0755", "--dir", d]
    for f in files:
        args += ["--ro-bind", f, f]
    return args


ETC_CACHE = Path("~/.cache/polar/etc")


def etc_copy() -> Path | None:
    """The ETC_FILES the host has, copied into a folder of their own (ETC_CACHE/<key of their stat>), so a
    sandbox's /etc is one read-only bind instead of one per file: bwrap reads the mount table again after each
    bind, ~3 ms of CPU per sandbox for these. A link at the top is followed, as a bind would; links inside the
    folders stay links. Remade when one of them changes (their own stat: a file edited in place inside one of the
    folders is not seen); None where it cannot be written (then one bind each)."""
    try:
        found = [(name, st) for name in ETC_FILES if (st := _stat_or_none(Path("/etc", name))) is not None]
        key = hashlib.sha256(repr([(n, s.st_ino, s.st_mtime_ns, s.st_size) for n, s in found]).encode())
        return made_once(ETC_CACHE.expanduser() / key.hexdigest()[:16], lambda tmp: _copy_etc(tmp, found))
    except OSError:
        return None


def _stat_or_none(path: Path) -> os.stat_result | None:
    """os.stat, or None where exists() would say False (a broken link too): one call, not two."""
    try:
        return os.stat(path)
    except OSError:
        return None


def _copy_etc(into: Path, found: Sequence[tuple[str, os.stat_result]]) -> None:
    for name, st in found:
        dst = into / name
        dst.parent.mkdir(mode=0o755, exist_ok=True)
        if S_ISDIR(st.st_mode):
            shutil.copytree(Path("/etc", name), dst, symlinks=True)
        else:
            shutil.copy2(Path("/etc", name), dst)


def tool_binds() -> tuple[list[str], str]:
    """Read-only binds for node, the harness CLIs and the forwarder's interpreter; and that interpreter."""
    seen = ["/usr"]
    args: list[str] = []

    def bind(d: Path) -> None:
        if d.is_dir() and not _visible(d, seen):
            args.extend(["--ro-bind", str(d), str(d)])
            seen.append(str(d))

    node = shutil.which("node")
    if node:
        bind(Path(node).resolve().parents[1])  # node's prefix (nothing to add for /usr/bin/node)
    bind(TOOLS)
    python = SYSTEM_PYTHON if SYSTEM_PYTHON.exists() else Path(sys.executable).resolve()
    if python != SYSTEM_PYTHON:
        bind(Path(sys.base_prefix).resolve())
    return args, str(python)


def _parents(dirs: Sequence[Path]) -> list[str]:
    """The directories holding the writable binds, shallowest first, except / and the private /tmp."""
    found = {str(d.parent) for d in dirs} - {"/", "/tmp"}
    return sorted(found, key=lambda d: (d.count("/"), d))


def _ancestors(paths: Sequence[str]) -> list[str]:
    """Every directory above these paths, except /, shallowest first."""
    found = {str(p) for path in paths for p in Path(path).parents} - {"/"}
    return sorted(found, key=lambda d: (d.count("/"), d))


def kernel_covers() -> list[str]:
    """bwrap arguments that keep the kernel's knobs read-only over the private /proc (bwrap's own cover of
    /proc/sys does not happen on this kernel; the host's /proc/sys shows the sandbox's own net namespace)."""
    return [a for p in ("/proc/sys", "/proc/sysrq-trigger") if os.path.exists(p) for a in ("--ro-bind", p, p)]


class BwrapSandbox(_HostSandbox):
    def __init__(self, mounts: Mounts, bwrap: str, limits: Limits, who: Identity | None = None) -> None:
        super().__init__(mounts, limits)
        self.bwrap, self.who = bwrap, who
        self.tools, self.python = tool_binds()

    def identity_args(self) -> list[str]:
        """Unprivileged: a user namespace of ours, no capability. Root: no user namespace (it would map to the
        host's uid 0); the first process keeps only what it needs to drop to `who`, then has none."""
        if self.who is None:  # and no user namespace of its own inside ours (seccomp refuses it for root's too)
            return ["--unshare-user", "--disable-userns", "--cap-drop", "ALL"]
        return ["--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]

    def command(self, cwd: Path, own_net: bool = True) -> list[str]:
        """bwrap's command line; `own_net` False: the sandbox stays in the network namespace bwrap starts in
        (one of loopback only that the node made: polar/sandbox/netns.py)."""
        own = self.mounts.own()
        parents = _parents([Path(at) for _src, at in own])
        cmd = [self.bwrap, *self.identity_args(), *(["--unshare-net"] if own_net else []), "--unshare-pid",
               "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try", "--die-with-parent", "--new-session",
               *system_view(), "--dev", "/dev", "--proc", "/proc", *kernel_covers(), "--perms", "1777",
               "--tmpfs", "/tmp"]
        for d in parents:
            cmd += ["--tmpfs", d]  # HOME's parent (the run folder) holds only the binds here, read-only
        binds = [*self.tools[2::3], BRIDGE_IN_SANDBOX, *(at for _src, at in own),
                 *(d for _s, d in (*self.mounts.binds, *self.mounts.ro_binds))]
        for d in _ancestors(binds):  # bwrap would make them 0700, closed to an unprivileged first process
            cmd += ["--perms", "0755", "--dir", d]
        cmd += [*self.tools, "--ro-bind", bridge.__file__, BRIDGE_IN_SANDBOX]
        for src, at in own:
            cmd += ["--bind", str(src), at]
        for src, dst in self.mounts.binds:
            cmd += ["--bind", str(src), dst]
        for src, dst in self.mounts.ro_binds:
            cmd += ["--ro-bind", str(src), dst]
        for d in ("/", *parents):
            cmd += ["--remount-ro", d]
        return cmd + ["--chdir", str(cwd), "--"] + (self.who.setpriv() if self.who else [])

    def exec(self, argv: Sequence[str], env: Mapping[str, str], cwd: Path, timeout_s: float,
             stdout: Path, stderr: Path, forwards: Sequence[tuple[int, Path]] = ()) -> ExecResult:
        # Forwards: as root, the node listens in a namespace it made (netns.py); otherwise the in-sandbox
        # forwarder, whose python start costs ~20 ms of CPU, listens in bwrap's own.
        enter = netns.nsenter() if forwards else None
        fd = seccomp.program_fd()  # polar/sandbox/seccomp.py: loaded by bwrap just before the command runs
        net = netns.own_net(forwards) if enter else None  # None where refused: then the forwarder
        try:
            inner = bridged(argv, forwards, self.python, BRIDGE_IN_SANDBOX) if forwards and not net else list(argv)
            cmd = self.command(cwd, own_net=net is None)
            cmd[1:1] = ["--seccomp", str(fd)]
            if net:
                cmd[:0] = [enter, f"--net={net.path}", "--"]
            return run_as(self.who, self.mounts, cmd + inner, env, cwd, timeout_s, stdout, stderr, self.limits,
                          pass_fds=(fd,))
        finally:
            os.close(fd)
            if net:
                net.close()


class BwrapRuntime:
    name = "bwrap"

    def __init__(self, limits: Limits = DEFAULT_LIMITS) -> None:
        self.limits = limits

    def prepare(self, mounts: Mounts, image: str | None = None, instance: str | None = None) -> Sandbox:
        bwrap = shutil.which("bwrap")
        if not bwrap:
            raise SandboxError("bwrap runtime: `bwrap` (bubblewrap) not found")
        try:
            who = sandbox_identity()
        except RuntimeError as e:
            raise SandboxError(f"bwrap runtime: {e}") from e
        return BwrapSandbox(mounts, bwrap, self.limits, who)

    def attach(self, mounts: Mounts, image: str | None, instance: str | None) -> Sandbox:
        return self.prepare(mounts)


def _apptainer_installed() -> bool:
    return bool(shutil.which("apptainer")) or (TOOLS / "apptainer" / "usr" / "bin" / "apptainer").exists()


def names_oci_image(image: str | None) -> bool:
    """Whether a task's image is the container engine's: docker://REF, a tag (`name:tag`, no such path), a
    `docker save` tarball or a Dockerfile (a Harbor task's, built there); a SIF or a sandbox directory is
    Apptainer's."""
    if not image or image == "host":
        return False
    path = Path(image)
    return image.startswith("docker://") or image.endswith((".tar", ".tar.gz", "/Dockerfile")) or (
        not path.exists() and not image.startswith("/") and ":" in image)


def _engine_installed() -> bool:
    return any(shutil.which(cli) for cli in ("podman", "docker"))


def resolve_runtime(name: str, image: str | None = None) -> str:
    """The runtime a name stands for: `auto` is the container engine for a task that names an OCI image, apptainer
    for one that names another image (when registered and installed), else bwrap; `local` is never chosen for you."""
    if name != "auto":
        if name not in REGISTRY:
            raise ValueError(f"unknown runtime {name!r}; expected one of {RUNTIMES}")
        return name
    if names_oci_image(image) and "docker" in REGISTRY and _engine_installed():
        return "docker"
    if image and image != "host" and "apptainer" in REGISTRY and _apptainer_installed():
        return "apptainer"
    if shutil.which("bwrap"):
        return "bwrap"
    raise SandboxError("runtime auto: no isolated runtime is installed (bubblewrap, apptainer: `make setup` "
                       "installs them); pass --runtime local to run on the host filesystem instead")


def get_runtime(name: str, image: str | None = None, limits: Limits | None = None) -> Runtime:
    """The runtime called `name` ("auto" resolved for a task with this image), with these limits."""
    module, _, cls = REGISTRY[resolve_runtime(name, image)].partition(":")
    factory = getattr(importlib.import_module(module), cls)
    return factory() if limits is None else factory(limits=limits)
