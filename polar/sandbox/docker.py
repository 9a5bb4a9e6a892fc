"""The container runtime (`--runtime docker`): a harness in an OCI container, driven through the podman or the
docker CLI (the first that works: podman, which needs no daemon, then docker with a reachable daemon;
POLAR_DOCKER=podman|docker chooses).

`prepare` starts one container per sandbox, detached, whose first process only reaps orphans; each harness or
evaluator step is an `exec` into it, and `stop` removes it (`rm -f`). The promises are Apptainer's: no network
but loopback (`--network none`; the proxy through the unix sockets of polar/sandbox/bridge.py in the shared
folder), a read-only root with only HOME, the workspace, the socket folder and a size-bounded /tmp writable, no
capability, no-new-privileges, the harness CLIs, node and the forwarder bound read-only at their host paths,
`--pids-limit`/`--memory`/`--cpus` and explicit rlimits. After each exec every process it left is killed
(`kill -9 -1` from inside: all but the container's first process).

Who runs (issue 66): under podman, the image's own user, root unless its USER says otherwise, as terminal-bench
images expect (root's build-time configuration, tools under /usr/local), in a user namespace: Polar as root maps
it onto polar-sandbox's subordinate ids (`--uidmap`, identity.py), unprivileged podman onto the caller. The
container's root holds the capabilities a root process uses on its own files (ROOT_CAPS), in that namespace
only; the host never sees uid 0 from a sandbox. The sample's HOME starts with the image user's home (dotfiles,
`git config --global`; `seed_home`). docker has no per-container user namespace: there every process runs as
polar-sandbox (Polar as root) or the caller, with no capability.

Images (a task's `image:`): `docker://REF` or a local tag (`polar-tasks:local`), a `docker save` tarball
(loaded once), a Harbor task's Dockerfile (built once, from base images on the node only), or a root filesystem
directory (imported once, cached under a tag derived from the directory; the demo tasks' Apptainer sandbox
directory works as is). Containers carry the label `polar.sandbox`, the host and the
HOME they serve: `prepare` also removes leftovers whose HOME is gone or that are older than MAX_AGE_S (a
worker killed with SIGKILL leaves its container to the next prepare on the node).

Measured quirks (docs/design.md §6): Debian's podman 4.3 needs `--runtime runc` on hybrid cgroups (crun refuses
them) and a containers.conf without default ulimits (root here lacks CAP_SYS_RESOURCE; CONTAINERS_CONF points
at polar/sandbox/containers.conf unless set); RLIMIT_NPROC above ~32k is refused.
"""
from __future__ import annotations

import hashlib
import json
import os
import resource
import shutil
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from polar.sandbox import bridge, seccomp, supervisor
from polar.sandbox.build_context import ContextError, caps_from_env, context_digest, missing_image, pull_policy
from polar.sandbox.apptainer import read_only_binds
from polar.sandbox.identity import IdRange, Identity, IdentityError, sandbox_identity, subordinate_range
from polar.sandbox.image_names import MAP_ENV, image_map, mapped, qualified
from polar.sandbox.limits import DEFAULT_LIMITS, Limits
from polar.sandbox.runtime import ExecResult, Mounts, SandboxError, _copy, bridged, run_as

ENGINES = ("podman", "docker")
LABEL = "polar.sandbox"
CONTAINERS_CONF = Path(__file__).with_name("containers.conf")
MAX_AGE_S = 2 * 24 * 3600  # no sample lives this long: an older container is a leftover
TMP_BYTES = 1 << 30  # the private /tmp (tmpfs, counted in the container's memory)
NOFILE = 65536  # at most our own hard limits: root without CAP_SYS_RESOURCE cannot raise them
NPROC = 16384  # per host uid, so shared by every sample's polar-sandbox processes; --pids-limit bounds one
CLI_TIMEOUT_S = 300.0  # an engine command (not an exec) that takes longer is hung
BUILD_TIMEOUT_S = 1800.0  # a Harbor task's Dockerfile build
# podman's conmon writes a file named `oom` into the folder `run` was started from when a container is OOM
# killed: the engine runs from a folder of its own, not the caller's (a checkout, a workspace).
CLI_CWD = Path(tempfile.gettempdir()) / "polar-container-cli"
# The first process reaps orphans (a plain `sleep` would leave them as zombies, counted by --pids-limit): the
# image's python3, or a shell loop in an image without one.
REAPER = ("import os, signal, time\nsignal.signal(signal.SIGTERM, lambda *_: os._exit(0))\nwhile True:\n"
          "    try:\n        os.wait()\n    except ChildProcessError:\n        time.sleep(0.5)\n")
INIT = ["sh", "-c", 'command -v python3 >/dev/null && exec python3 -I -c "$0"; trap "exit 0" TERM; '
        'while :; do sleep 1; done', REAPER]
# What root inside a podman container may do, in its user namespace only: its own files and processes (apt
# drops to _apt, servers bind low ports). No CAP_SYS_ADMIN, no MKNOD, no raw sockets.
ROOT_CAPS = ("CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "SETUID", "SETGID", "NET_BIND_SERVICE")
HOME_SEED_BYTES = 64 << 20  # an image's home larger than this (a cache baked in) is not copied into the sample's
# Run after every exec, as the sandbox's user: count and kill what is left (kill -1 spares pid 1 and itself).
REAP = ('n=0; for d in /proc/[0-9]*; do p=${d#/proc/}; [ "$p" = 1 ] || [ "$p" = $$ ] || n=$((n + 1)); done; '
        'kill -9 -1 2>/dev/null; echo "$n"')


@dataclass(frozen=True)
class Engine:
    """One container CLI and how to call it."""

    kind: str  # podman | docker
    cli: str

    def base(self) -> list[str]:
        runc = shutil.which("runc", path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin")
        return [self.cli, "--runtime", runc] if self.kind == "podman" and runc else [self.cli]

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        if self.kind == "podman":
            env.setdefault("CONTAINERS_CONF", str(CONTAINERS_CONF))
        return env

    def run(self, args: Sequence[str], check: bool = True, stdin: int | None = None,
            timeout: float = CLI_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
        CLI_CWD.mkdir(mode=0o700, exist_ok=True)
        proc = subprocess.run([*self.base(), *args], env=self.env(), stdin=stdin, capture_output=True, text=True,
                              timeout=timeout, cwd=CLI_CWD)
        if check and proc.returncode != 0:
            raise SandboxError(f"docker runtime: `{self.kind} {' '.join(args[:2])}` failed: "
                               f"{' '.join(proc.stderr.split())[-600:]}")
        return proc


def find_engine(choice: str | None = None) -> Engine:
    """podman if installed, else docker if its daemon answers; `choice` (or POLAR_DOCKER) names one."""
    choice = choice or os.environ.get("POLAR_DOCKER") or None
    if choice and choice not in ENGINES:
        raise SandboxError(f"POLAR_DOCKER={choice!r}: expected one of {', '.join(ENGINES)}")
    for kind in (choice,) if choice else ENGINES:
        cli = shutil.which(kind)
        if cli and (kind == "podman" or _answers(Engine(kind, cli))):
            return Engine(kind, cli)
    wanted = choice or " or ".join(ENGINES)
    raise SandboxError(f"docker runtime: no working {wanted} (make setup installs podman)")


def _answers(engine: Engine) -> bool:
    try:
        return engine.run(["version", "--format", "{{.Server.Version}}"], check=False, timeout=20).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def engine_installed() -> bool:
    try:
        find_engine()
        return True
    except SandboxError:
        return False


# -- images -------------------------------------------------------------------------------------------------------
def _exists(engine: Engine, ref: str) -> bool:
    return engine.run(["image", "inspect", "--format", "{{.Id}}", ref], check=False).returncode == 0


def image_ref(engine: Engine, image: str) -> str:
    """The engine's name for a task's image: a tag or docker:// reference (pulled when missing only with
    POLAR_PULL=missing), a `docker save` tarball (loaded), a root filesystem directory (imported); raises
    SandboxError naming the image."""
    path = Path(image)
    if image.startswith("/") and not path.exists():
        raise SandboxError(f"docker runtime: image {image} not found")
    if path.name == "Dockerfile" and path.is_file():
        return build_dockerfile(engine, path)
    if image.startswith("docker://") or not path.exists():
        return present(engine, image.removeprefix("docker://"))
    if path.is_dir():
        return import_rootfs(engine, path)
    if tarfile.is_tarfile(path):
        return load_tarball(engine, path)
    raise SandboxError(f"docker runtime: image {image} is neither an OCI reference, a `docker save` tarball nor a "
                       "root filesystem directory (a SIF is Apptainer's: --runtime apptainer)")


def local_name(engine: Engine, ref: str, table: Mapping[str, str]) -> str | None:
    """The name `ref` has on this node: as written, the operator's mapped reference, or its qualified name;
    None when none of them is here."""
    for name in dict.fromkeys((ref, mapped(ref, dict(table)), qualified(ref))):
        if name and _exists(engine, name):
            return name
    return None


def present(engine: Engine, ref: str) -> str:
    """The name this node runs `ref` by (local_name), else the operator's mapped reference (POLAR_IMAGE_MAP) or
    its qualified name (polar/sandbox/image_names.py) pulled, only with POLAR_PULL=missing; else SandboxError
    naming the ways to provide it."""
    try:
        table, policy = image_map(), pull_policy()
    except (ContextError, ValueError) as e:
        raise SandboxError(f"docker runtime: {e}") from e
    if (name := local_name(engine, ref, table)) is not None:
        return name
    source = mapped(ref, table) or qualified(ref)
    if policy == "never":
        raise SandboxError(missing_image(source, engine.kind) + f", or map {ref} to a reachable one in {MAP_ENV}")
    engine.run(["pull", "--quiet", source])
    return source


def build_dockerfile(engine: Engine, dockerfile: Path) -> str:
    """A Harbor task's environment/Dockerfile as an image, built once (tagged by its build context's contents),
    without a registry: every base image it names must be on this node already, else SandboxError naming it.
    The context is hashed within caps (polar/sandbox/build_context.py), never read whole."""
    context = dockerfile.parent
    try:
        tag = f"polar-harbor:{context_digest(context, caps_from_env())[:16]}"
    except (ContextError, OSError) as e:
        raise SandboxError(f"docker runtime: {dockerfile}: {e}") from e
    if _exists(engine, tag):
        return tag
    for base in dockerfile_bases(dockerfile.read_text(errors="replace")):
        if not _exists(engine, base):  # the build finds it under its own name, as the Dockerfile writes it
            try:
                engine.run(["tag", present(engine, base), base])
            except SandboxError as e:
                raise SandboxError(f"docker runtime: {dockerfile}: base {str(e).removeprefix('docker runtime: ')}")
    never = ["--pull=never"] if engine.kind == "podman" else []
    engine.run(["build", "--network", "none", *never, "-t", tag, "-f", str(dockerfile), str(context)],
               timeout=BUILD_TIMEOUT_S)
    return tag


def dockerfile_bases(text: str) -> list[str]:
    """The images a Dockerfile's FROM lines start from (not its own stages, not `scratch`, not ones an ARG
    names: the build itself says if those are missing)."""
    bases, stages = [], set()
    for line in text.splitlines():
        words = line.split()
        if len(words) < 2 or words[0].upper() != "FROM":
            continue
        words = [w for w in words[1:] if not w.startswith("--")]  # --platform=…
        if not words:
            continue
        image = words[0]
        if len(words) >= 3 and words[1].upper() == "AS":
            stages.add(words[2].lower())
        if image.lower() not in stages and image != "scratch" and "$" not in image and image not in bases:
            bases.append(image)
    return bases


def rootfs_tag(rootfs: Path) -> str:
    """A tag that changes when the directory is rebuilt (a new inode or mtime), so a stale import is not used."""
    st = rootfs.resolve().stat()
    key = hashlib.sha256(f"{rootfs.resolve()}:{st.st_ino}:{st.st_mtime_ns}".encode()).hexdigest()[:16]
    return f"polar-rootfs:{key}"


def import_rootfs(engine: Engine, rootfs: Path, tag: str | None = None) -> str:
    """The directory as an image (`tar | import`, ~13 s for the demo's 290 MB; once), also tagged `tag`."""
    ref = rootfs_tag(rootfs)
    if not _exists(engine, ref):
        if not (rootfs / "bin").exists() and not (rootfs / "usr" / "bin").is_dir():
            raise SandboxError(f"docker runtime: image directory {rootfs} holds no root filesystem")
        tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
        try:
            engine.run(["import", "--change", f"LABEL polar.rootfs={rootfs.resolve()}", "-", ref], stdin=tar.stdout)
        finally:
            tar.stdout.close()  # type: ignore[union-attr]
            tar.wait()
    if tag:
        engine.run(["tag", ref, tag])
    return ref


def load_tarball(engine: Engine, tarball: Path) -> str:
    """A `docker save` tarball's image: its first tag when the engine has it already, else loaded now."""
    try:
        with tarfile.open(tarball) as tar:
            member = tar.extractfile("manifest.json")
            tags = json.load(member)[0].get("RepoTags") or [] if member else []
    except (KeyError, ValueError, IndexError, tarfile.TarError):
        tags = []
    if tags and _exists(engine, tags[0]):
        return tags[0]
    out = engine.run(["load", "-i", str(tarball)]).stdout
    loaded = [line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Loaded image")]
    if not loaded:
        raise SandboxError(f"docker runtime: `load -i {tarball}` named no image: {out[-300:]}")
    return loaded[-1].split(",")[0].strip()


# -- containers ---------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Users:
    """Who a container's processes are. `user`: the uid:gid every exec names (None: the image's own user);
    `ids`: where the container's user namespace starts on the host (None: no map of ours)."""

    user: Identity | None
    ids: IdRange | None

    @property
    def root_inside(self) -> bool:
        return self.user is None

    def owner(self, inside: Identity) -> Identity | None:
        """The host identity the sandbox's folders are handed to, for processes running as `inside` (None: ours,
        when Polar is unprivileged)."""
        if self.ids is not None:
            return self.ids.host(inside)
        return self.user if self.user is not None and os.geteuid() == 0 else None


def users_for(engine: Engine) -> Users:
    """podman: the image's user in a user namespace (polar-sandbox's subordinate ids when we are root);
    docker: polar-sandbox when we are root, else the caller."""
    try:
        if engine.kind == "podman":
            return Users(None, subordinate_range() if os.geteuid() == 0 else None)
        return Users(sandbox_identity() or Identity(os.getuid(), os.getgid()), None)
    except IdentityError as e:
        raise SandboxError(f"docker runtime: {e}") from e


def user_args(users: Users) -> list[str]:
    return ["--user", f"{users.user.uid}:{users.user.gid}"] if users.user else []


def run_args(engine: Engine, mounts: Mounts, users: Users, limits: Limits, cpus: float) -> list[str]:
    """The isolation and limits of one sandbox container (everything but its name and image)."""
    nofile, nproc = (_at_most(resource.RLIMIT_NOFILE, NOFILE), _at_most(resource.RLIMIT_NPROC, NPROC))
    args = ["--detach", "--rm", "--label", LABEL, "--label", f"polar.node={socket.gethostname()}",
            "--label", f"polar.home={mounts.home}",
            "--label", f"polar.created={int(time.time())}", "--network", "none",
            *([] if mounts.root_writable else ["--read-only"]),
            "--tmpfs", f"/tmp:rw,nosuid,nodev,size={TMP_BYTES}", "--cap-drop", "ALL",
            *(["--cap-add", ",".join(ROOT_CAPS)] if users.root_inside else []),
            "--security-opt", "no-new-privileges", *user_args(users),
            "--pids-limit", str(limits.processes), "--memory", str(limits.memory_bytes),
            "--memory-swap", str(limits.memory_bytes), "--cpus", f"{limits.cpus or cpus:g}",
            "--ulimit", f"nofile={nofile}:{nofile}", "--ulimit", f"nproc={nproc}:{nproc}",
            "--ulimit", f"fsize={limits.file_bytes}:{limits.file_bytes}", "--ulimit", "core=0:0"]
    if engine.kind == "podman":
        args += ["--read-only-tmpfs=false"]  # podman adds writable /run, /var/tmp otherwise
        # its default profile allows new user namespaces: that allowlist less ours (polar/sandbox/seccomp.py);
        # docker's default refuses them already (no CAP_SYS_ADMIN), so docker keeps its own
        args += ["--security-opt", f"seccomp={seccomp.profile_file()}"]
        if users.ids is not None:
            ids = users.ids
            args += ["--uidmap", f"0:{ids.uid}:{ids.count}", "--gidmap", f"0:{ids.gid}:{ids.count}"]
    for src, at in mounts.own():
        args += ["--volume", f"{src}:{at}"]
    for src, dst in mounts.binds:
        args += ["--volume", f"{src}:{dst}"]
    for src, dst in mounts.ro_binds:
        args += ["--volume", f"{src}:{dst}:ro"]
    for src, dst in read_only_binds():
        args += ["--volume", f"{src}:{dst}:ro"]
    return args


def _at_most(kind: int, value: int) -> int:
    hard = resource.getrlimit(kind)[1]
    return value if hard == resource.RLIM_INFINITY else min(value, hard)


def remove_leftovers(engine: Engine, max_age_s: float = MAX_AGE_S) -> list[str]:
    """Remove this host's Polar containers whose HOME no longer exists or that are older than `max_age_s` (an
    engine shared by several hosts holds others' containers too: their HOMEs are not ours to look at)."""
    ids = engine.run(["ps", "-a", "-q", "--filter", f"label={LABEL}", "--filter",
                      f"label=polar.node={socket.gethostname()}"], check=False).stdout.split()
    if not ids:
        return []
    fmt = '{{.Name}}|{{index .Config.Labels "polar.home"}}|{{index .Config.Labels "polar.created"}}'
    found = engine.run(["inspect", "--format", fmt, *ids], check=False).stdout.splitlines()
    stale = []
    for line in found:
        name, home, created = (line.split("|") + ["", ""])[:3]
        old = created.isdigit() and time.time() - int(created) > max_age_s
        if old or (home and not Path(home).exists()):
            stale.append(name.lstrip("/"))
    if stale:
        engine.run(["rm", "-f", *stale], check=False)
    return stale


class DockerSandbox:
    """One running container; `exec` may be called many times (harness, then evaluator)."""

    def __init__(self, mounts: Mounts, name: str, engine: Engine, users: Users) -> None:
        self.mounts, self.name, self.engine, self.users = mounts, name, engine, users
        # the host identity the folders are handed to (None: we are unprivileged)
        self.drop_to = users.owner(self.inside() if users.root_inside else users.user)

    def inside(self) -> Identity:
        """The uid:gid an exec runs as in the container (the image's user when no --user is named)."""
        out = self.engine.run(["exec", *user_args(self.users), self.name, "sh", "-c", "id -u; id -g"],
                              timeout=60).stdout.split()
        if len(out) != 2 or not all(x.isdigit() for x in out):
            raise SandboxError(f"docker runtime: `id` in container {self.name} printed {out!r}")
        return Identity(int(out[0]), int(out[1]))

    def seed_home(self) -> str | None:
        """Copy the image user's home (dotfiles, `git config --global`, …) into the sample's HOME, keeping what
        Polar put there; a note when it was not copied (too large, no tar in the image), else None."""
        script = 'cd ~ 2>/dev/null && [ "$PWD" != / ] && exec tar -c --exclude=./.cache -f - .'
        cmd = [*self.engine.base(), "exec", *user_args(self.users), self.name, "sh", "-c", script]
        with tempfile.TemporaryFile() as tar_file:
            proc = subprocess.Popen(cmd, env=self.engine.env(), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                    cwd=CLI_CWD)
            size = 0
            while chunk := proc.stdout.read(1 << 16):
                size += len(chunk)
                if size > HOME_SEED_BYTES:
                    proc.kill()
                    proc.wait()
                    return f"the image's home is over {HOME_SEED_BYTES >> 20} MiB: not copied into the sample's HOME"
                tar_file.write(chunk)
            if proc.wait(60) != 0 or size == 0:
                return None if size == 0 else "the image's home could not be read (no tar in the image?)"
            tar_file.seek(0)
            try:  # the image's files are the task's data: the `data` filter keeps them inside HOME, plain
                with tarfile.open(fileobj=tar_file) as tar:
                    keep = [m for m in tar.getmembers() if not (self.mounts.home / m.name).exists()]
                    tar.extractall(self.mounts.home, members=keep, filter="data")
            except (tarfile.TarError, OSError) as e:
                return f"the image's home was not copied into the sample's HOME: {e}"
        return None

    def exec(self, argv: Sequence[str], env: Mapping[str, str], cwd: Path, timeout_s: float,
             stdout: Path, stderr: Path, forwards: Sequence[tuple[int, Path]] = ()) -> ExecResult:
        inner = list(argv)
        if forwards:  # the image's own python3 runs the forwarder (bound in read-only)
            inner = bridged(inner, forwards, python="python3", script=str(Path(bridge.__file__).resolve()))
        # The session's environment (its token) in an anonymous memory file the CLI reads as /dev/fd/N: never on
        # a command line, never in the sandbox, never on disk where a killed run would leave it.
        fd = os.memfd_create("polar-env", os.MFD_CLOEXEC)
        try:
            os.write(fd, "".join(f"{k}={v}\n" for k, v in env.items() if "\n" not in v).encode())
            multiline = [a for k, v in env.items() if "\n" in v for a in ("--env", k)]  # from the CLI's own env
            cmd = [*self.engine.base(), "exec", *user_args(self.users), "--workdir", str(cwd),
                   "--env-file", f"/dev/fd/{fd}", *multiline, self.name, *inner]
            client_env = {**self.engine.env(), **{k: v for k, v in env.items() if "\n" in v}}
            result = run_as(self.drop_to, self.mounts, cmd, client_env, self.mounts.workspace, timeout_s,
                            stdout, stderr, None, pass_fds=(fd,))
        finally:
            os.close(fd)
            reaped = self._reap()
        return ExecResult(result.exit_code, result.timed_out, result.wall_s, reaped)

    def _reap(self) -> int:
        """Kill whatever the exec left running (a killed `exec` client leaves its processes in the container)."""
        proc = self.engine.run(["exec", *user_args(self.users), self.name, "sh", "-c", REAP],
                               check=False, timeout=60)
        count = proc.stdout.strip().splitlines()[-1:] if proc.returncode == 0 else []
        return int(count[0]) if count and count[0].isdigit() else 0

    def copy_in(self, src: Path, dst: Path) -> None:
        _copy(src, dst)  # the bound folders are the host's own

    def copy_out(self, src: Path, dst: Path) -> None:
        _copy(src, dst)

    def stop(self) -> None:
        """Remove the container (every process in it); safe to call twice."""
        args = ["rm", "-f", "-t", "0", self.name] if self.engine.kind == "podman" else ["rm", "-f", self.name]
        proc = self.engine.run(args, check=False)
        if proc.returncode != 0 and "no such container" not in proc.stderr.lower():
            raise SandboxError(f"docker runtime: could not remove container {self.name}: {proc.stderr.strip()}")
        supervisor.release(watch_key(self.name))


class DockerRuntime:
    name = "docker"

    def __init__(self, limits: Limits = DEFAULT_LIMITS, cpus: float = 2.0, engine: str | None = None) -> None:
        self.limits, self.cpus, self.engine_choice = limits, cpus, engine

    def prepare(self, mounts: Mounts, image: str | None = None, instance: str | None = None) -> DockerSandbox:
        """Start a container of `image`; raises SandboxError naming the image or the engine's complaint."""
        if not image or image == "host":
            raise SandboxError("docker runtime: the task names no image (image: host); give an OCI image, a "
                               "`docker save` tarball or a root filesystem directory, or use --runtime bwrap|local")
        engine = find_engine(self.engine_choice)
        users = users_for(engine)
        remove_leftovers(engine)
        ref = image_ref(engine, image)
        name = instance or f"polar-{os.urandom(6).hex()}"
        # conmon's container, not our child: registered before it starts (polar/sandbox/supervisor.py)
        supervisor.watch_command(watch_key(name), [*engine.base(), "rm", "-f", *(["-t", "0"] if engine.kind ==
                                                   "podman" else []), name], engine.env())
        engine.run(["run", "--name", name, *run_args(engine, mounts, users, self.limits, self.cpus), ref, *INIT])
        sandbox = DockerSandbox(mounts, name, engine, users)
        if users.root_inside and (note := sandbox.seed_home()):
            print(f"docker runtime: {note}", file=sys.stderr)
        return sandbox

    def attach(self, mounts: Mounts, image: str | None, instance: str | None) -> DockerSandbox:
        """The running container `instance` again (a later stage, maybe another process)."""
        if not instance:
            raise SandboxError("docker runtime: no running container to attach to (the sandbox never started)")
        engine = find_engine(self.engine_choice)
        return DockerSandbox(mounts, instance, engine, users_for(engine))


def watch_key(name: str) -> str:
    return f"container:{name}"


def main(argv: Sequence[str] = tuple(sys.argv[1:])) -> int:
    """`python -m polar.sandbox.docker import ROOTFS TAG`: make setup's import of the demo tasks' image."""
    if len(argv) != 3 or argv[0] != "import":
        print("usage: python -m polar.sandbox.docker import ROOTFS_DIR TAG", file=sys.stderr)
        return 2
    try:
        engine = find_engine()
        ref = import_rootfs(engine, Path(argv[1]), argv[2])
    except SandboxError as e:
        print(e, file=sys.stderr)
        return 1
    print(f"{engine.kind}: {argv[2]} ({ref})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
