"""The Apptainer runtime: a harness in an Apptainer instance of the task's image, driven through spython.

`prepare(mounts, image=…)` starts one instance (spython `Client.instance`) with `--containall --no-home --net
--network none` (a network namespace holding only loopback), the sample's HOME, workspace and shared folder bound
writable at the same paths, and read-only: the harness CLIs (.tools/npm), the host's node and polar/sandbox/bridge.py.
`exec` runs a command in that instance (`apptainer exec instance://NAME`) in its own process group, output to
files, with our own timeout (spython's execute has none); `stop` stops the instance (spython). The proxy is
reached as in bwrap: unix sockets in the shared folder and the stdlib-only forwarder polar/sandbox/bridge.py, run by the
image's own python3. The instance is named, so a later stage in another process reattaches with `attach`.

Rootless (an unprivileged user) uses user namespaces; a SIF needs /dev/fuse then, so use a sandbox directory.
Root works with `root default capabilities = no` in apptainer.conf (scripts/install_apptainer.sh sets it); then
every `exec` runs as the unprivileged polar-sandbox user (`--security uid:…,gid:…`, polar/sandbox/identity.py),
never as the host's uid 0. No /sys in the container (`--no-mount sys`); /proc/sys is refused to that uid.
"""
from __future__ import annotations

import io
import os
import pwd
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Mapping, Sequence

from polar.sandbox import bridge, seccomp, supervisor
from polar.sandbox.identity import Identity, sandbox_identity
from polar.sandbox.limits import DEFAULT_LIMITS, Limits
from polar.sandbox.runtime import PROJECT_ROOT, ExecResult, Mounts, SandboxError, _copy, bridged, run_as

APPTAINER_DIR = PROJECT_ROOT / ".tools" / "apptainer" / "usr" / "bin"
NPM_DIR = PROJECT_ROOT / ".tools" / "npm"
HOST_NODE = Path("/usr/bin/node")
START_OPTIONS = ("--containall", "--no-home", "--net", "--network", "none", "--no-mount", "sys")


def apptainer_bin() -> Path:
    """The apptainer binary (the relocated one of make setup first), with its `singularity` link on PATH for
    spython, which calls `singularity`."""
    _config_dir()
    for d in (APPTAINER_DIR, *(Path(p) for p in os.environ.get("PATH", "").split(os.pathsep) if p)):
        if (d / "apptainer").is_file() and (d / "singularity").exists():
            if str(d) not in os.environ.get("PATH", "").split(os.pathsep):
                os.environ["PATH"] = f"{d}{os.pathsep}{os.environ.get('PATH', '')}"
            return d / "apptainer"
    raise SandboxError(f"apptainer runtime: no apptainer with a `singularity` link in {APPTAINER_DIR} or on PATH "
                       "(make setup installs it)")


def _config_dir() -> None:
    """Apptainer keeps instance records under the passwd home's .apptainer; a user whose home is not writable
    (nobody: /nonexistent) gets $HOME/.apptainer, else a per-user folder in the temporary directory. The same
    for every stage of a sample, so a later stage finds the instance."""
    if "APPTAINER_CONFIGDIR" in os.environ:
        return
    if os.access(pwd.getpwuid(os.getuid()).pw_dir, os.W_OK):
        return
    home = os.environ.get("HOME", "")
    folder = Path(home) / ".apptainer" if home and os.access(home, os.W_OK) else \
        Path(tempfile.gettempdir()) / f"polar-apptainer-{os.getuid()}"
    os.environ["APPTAINER_CONFIGDIR"] = str(folder)


def read_only_binds() -> list[tuple[Path, Path]]:
    """Host paths every sandbox sees read-only, at the same path: harness CLIs, node, the forwarder."""
    binds = [(Path(bridge.__file__).resolve(), Path(bridge.__file__).resolve())]
    if NPM_DIR.is_dir():
        binds.append((NPM_DIR, NPM_DIR))
    node = Path(shutil.which("node") or HOST_NODE)
    if node.exists():
        binds.append((node.resolve(), Path("/usr/bin/node")))
    return binds


def bind_args(mounts: Mounts, extra_ro: Sequence[tuple[Path, Path]] = ()) -> list[str]:
    args = []
    for src, at in mounts.own():
        args += ["--bind", f"{src}:{at}"]
    for src, dst in mounts.binds:
        args += ["--bind", f"{src}:{dst}"]
    for src, dst in mounts.ro_binds:
        args += ["--bind", f"{src}:{dst}:ro"]
    for src, dst in [*read_only_binds(), *extra_ro]:
        args += ["--bind", f"{src}:{dst}:ro"]
    return args


class ApptainerSandbox:
    """One running instance; `exec` may be called many times (harness, then evaluator)."""

    def __init__(self, mounts: Mounts, image: str, name: str, apptainer: Path, limits: Limits,
                 who: Identity | None = None) -> None:
        self.mounts, self.image, self.name, self.apptainer, self.limits = mounts, image, name, apptainer, limits
        self.who = who

    def exec(self, argv: Sequence[str], env: Mapping[str, str], cwd: Path, timeout_s: float,
             stdout: Path, stderr: Path, forwards: Sequence[tuple[int, Path]] = ()) -> ExecResult:
        inner = list(argv)
        if forwards:  # the image's own python3 runs the forwarder (bound in read-only)
            inner = bridged(inner, forwards, python="python3", script=str(Path(bridge.__file__).resolve()))
        if "HOME" in env:  # apptainer sets HOME itself (APPTAINERENV_HOME is ignored)
            inner = ["env", f"HOME={env['HOME']}", *inner]
        security = ["--security", f"uid:{self.who.uid},gid:{self.who.gid}"] if self.who else []
        if os.geteuid() == 0:  # Apptainer applies a seccomp profile for root only (polar/sandbox/seccomp.py)
            security += ["--security", f"seccomp:{seccomp.profile_file(apptainer=True)}"]
        cmd = [str(self.apptainer), "-s", "exec", "--cleanenv", *security, "--pwd", str(cwd),
               f"instance://{self.name}", *inner]
        return run_as(self.who, self.mounts, cmd, host_env(env), self.mounts.workspace, timeout_s, stdout, stderr,
                      self.limits)

    def copy_in(self, src: Path, dst: Path) -> None:
        _copy(src, dst)  # the bound folders are the host's own

    def copy_out(self, src: Path, dst: Path) -> None:
        _copy(src, dst)

    def stop(self) -> None:
        """Stop the instance (every process in it); safe to call twice."""
        from spython.main import Client

        with _quiet_spython():
            Client.instance(self.image, start=False, name=self.name).stop(quiet=True)
        supervisor.release(watch_key(self.name))


def host_env(env: Mapping[str, str]) -> dict[str, str]:
    """The apptainer CLI's own environment: ours (PATH, HOME for its instance records) plus the sandbox's
    variables as APPTAINERENV_* (with --cleanenv nothing else of ours crosses into the container)."""
    out = {k: v for k, v in os.environ.items() if not k.startswith(("APPTAINERENV_", "SINGULARITYENV_"))}
    out.update({f"APPTAINERENV_{k}": v for k, v in env.items()})
    return out


class _quiet_spython:
    """spython reports a failed command through its logger; capture that text instead of printing it."""

    def __enter__(self) -> io.StringIO:
        from spython.logger import bot

        self.bot, self.saved = bot, (bot.errorStream, bot.outputStream)
        bot.errorStream = bot.outputStream = self.text = io.StringIO()
        return self.text

    def __exit__(self, *exc: object) -> None:
        self.bot.errorStream, self.bot.outputStream = self.saved


class ApptainerRuntime:
    name = "apptainer"

    def __init__(self, limits: Limits = DEFAULT_LIMITS) -> None:
        self.limits = limits

    def prepare(self, mounts: Mounts, image: str | None = None, instance: str | None = None) -> ApptainerSandbox:
        """Start an instance of `image` (a SIF or a sandbox directory); raises SandboxError naming the image."""
        apptainer, who = apptainer_bin(), _identity()
        if not image or image == "host":
            raise SandboxError("apptainer runtime: the task names no image (image: host); give a SIF or a sandbox "
                               "directory, or use --runtime bwrap|local")
        path = Path(image)
        if not path.exists():
            raise SandboxError(f"apptainer runtime: image {path} not found")
        if path.is_file() and os.geteuid() != 0 and not os.access("/dev/fuse", os.R_OK | os.W_OK):
            raise SandboxError(f"apptainer runtime: image {path} is a SIF, which an unprivileged user cannot mount "
                               "here (/dev/fuse is not accessible); use a sandbox directory "
                               "(`apptainer build --sandbox DIR IMAGE.sif`)")
        name = instance or f"polar-{uuid.uuid4().hex[:12]}"
        from spython.main import Client

        options = [*START_OPTIONS, *(["--writable-tmpfs"] if mounts.root_writable else []), *bind_args(mounts)]
        # Registered before it starts: the instance is its starter daemon's child, not ours, and a run killed
        # from here on must not leave it (polar/sandbox/supervisor.py)
        supervisor.watch_command(watch_key(name), [str(apptainer), "instance", "stop", "-F", name])
        with _quiet_spython() as log:
            started = Client.instance(str(path), name=name, options=options, quiet=True)
        if not getattr(started, "pid", None):
            supervisor.release(watch_key(name))
            detail = " ".join(log.getvalue().split())[-600:]
            raise SandboxError(f"apptainer runtime: instance of image {path} did not start: {detail}")
        return ApptainerSandbox(mounts, str(path), name, apptainer, self.limits, who)

    def attach(self, mounts: Mounts, image: str | None, instance: str | None) -> ApptainerSandbox:
        """The running instance `instance` again (a later stage, maybe another process)."""
        if not (image and instance):
            raise SandboxError("apptainer runtime: no running instance to attach to (the sandbox never started)")
        return ApptainerSandbox(mounts, image, instance, apptainer_bin(), self.limits, _identity())


def watch_key(name: str) -> str:
    return f"apptainer-instance:{name}"


def _identity() -> Identity | None:
    try:
        return sandbox_identity()
    except RuntimeError as e:
        raise SandboxError(f"apptainer runtime: {e}") from e
