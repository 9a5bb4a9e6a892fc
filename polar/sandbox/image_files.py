"""A task image's own files (issue 43): the agent works where the task's files are, in the image.

Terminal-bench style tasks put the files the task is about in their image (`WORKDIR /app`, `COPY app/ /app/`)
and leave the rest of the image read-only. Each runtime binds the sample's workspace over that workdir, so the
workspace starts as a copy of the image's own files there:
  workdir files   copied out of the image once per image id and workdir (`create` + `cp` through the container
                  engine, no container started) into the cache, POLAR_IMAGE_CACHE (default
                  ~/.cache/polar/images/<image id>/workdir-<hash>/); each sample's workspace is a fresh copy of
                  that folder, which is also the pristine workspace its verifier starts from (polar/scoring/allow.py)
  root filesystem for the Apptainer runtime: an OCI image (a tag, or a Harbor Dockerfile the engine built) is
                  exported once per image id to <cache>/<image id>/rootfs/, which Apptainer runs as a sandbox
                  directory; an export keeps files only, so the image's ENV comes along as the task's variables
An image is data from elsewhere: the workdir comes out through the engine's `cp` (links kept as links), then loses
its setuid bits and special files; the export's tar stream is unpacked by Python's tarfile `tar` filter (nothing
lands outside the destination, no device files, no setuid bits). Both are made in a temporary folder renamed into
place (polar_traj/atomic.py made_once), so a reader never sees a half-made one and two samples making the same
folder at once both end with it.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Iterator, Mapping

from polar.sandbox.docker import CLI_CWD, CLI_TIMEOUT_S, Engine
from polar.sandbox.runtime import SandboxError
from polar_traj.atomic import made_once

CACHE_ENV = "POLAR_IMAGE_CACHE"
DEFAULT_CACHE = "~/.cache/polar/images"


@dataclass(frozen=True)
class ImageFacts:
    """What Polar reads of a built image: its name and id, and the configuration an export leaves behind."""

    ref: str
    image_id: str
    workdir: str | None  # the image's WORKDIR; None for none or `/`
    env: Mapping[str, str]


def cache_root() -> Path:
    return Path(os.environ.get(CACHE_ENV) or DEFAULT_CACHE).expanduser()


def inspect_image(engine: Engine, ref: str) -> ImageFacts:
    data = json.loads(engine.run(["image", "inspect", ref]).stdout)[0]
    config = data.get("Config") or {}
    env = dict(item.split("=", 1) for item in config.get("Env") or [] if "=" in item)
    workdir = (config.get("WorkingDir") or "").rstrip("/") or None
    return ImageFacts(ref, data["Id"].removeprefix("sha256:"), workdir, MappingProxyType(env))


def workdir_files(engine: Engine, facts: ImageFacts, workdir: str) -> Path:
    """The image's files at `workdir` (an empty folder when it has none), made once."""
    key = hashlib.sha256(workdir.encode()).hexdigest()[:12]
    dest = cache_root() / facts.image_id[:32] / f"workdir-{key}"

    def make(tmp: Path) -> None:
        with _container(engine, facts.ref) as name:
            found = engine.run(["cp", f"{name}:{workdir}/.", str(tmp / "files")], check=False)
            if found.returncode != 0 and "no such file" not in found.stderr.lower():
                raise SandboxError(f"image {facts.ref}: cannot copy {workdir} out: {found.stderr.strip()[-300:]}")
        files = tmp / "files"
        files.mkdir(exist_ok=True)
        for entry in os.scandir(files):  # `cp` wants a destination it makes itself: then up one level
            os.rename(entry.path, tmp / entry.name)
        files.rmdir()
        _sanitise(tmp)

    return made_once(dest, make)


def root_filesystem(engine: Engine, facts: ImageFacts) -> Path:
    """The image exported to a directory Apptainer runs as a sandbox, made once."""
    dest = cache_root() / facts.image_id[:32] / "rootfs"

    def make(tmp: Path) -> None:
        with _container(engine, facts.ref) as name:
            _untar(engine, ["export", name], tmp)
        for d in ("proc", "sys", "dev", "tmp"):  # Apptainer mounts its own there
            (tmp / d).mkdir(exist_ok=True)
        if not (tmp / ".singularity.d").is_dir():  # an instance needs Apptainer's action scripts
            _apptainer_meta(tmp)
        _share_files(tmp, [p for p in dest.parent.parent.glob("*/rootfs") if p.is_dir()])

    return made_once(dest, make)


def _apptainer_meta(rootfs: Path) -> None:
    """Apptainer's /.singularity.d, from a sandbox build of an empty folder (it does not depend on the tree)."""
    from polar.sandbox.apptainer import apptainer_bin

    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "empty").mkdir()
        done = subprocess.run([str(apptainer_bin()), "-s", "build", "--sandbox", f"{tmp}/meta", f"{tmp}/empty"],
                              capture_output=True, text=True, timeout=CLI_TIMEOUT_S)
        if done.returncode != 0:
            raise SandboxError(f"apptainer build --sandbox (for /.singularity.d) failed: {done.stderr[-300:]}")
        shutil.copytree(Path(tmp) / "meta" / ".singularity.d", rootfs / ".singularity.d", symlinks=True)


def _share_files(rootfs: Path, others: list[Path]) -> None:
    """Hard-link the new root filesystem's files to identical ones (content, mode, owner, time) of the newest
    other one: images built on one base share most files, and each export would hold them all again (11 task
    images of the demo base: 3.5 GB, then ~0.3). Apptainer never writes into a sandbox directory it runs."""
    hardlink = shutil.which("hardlink")
    if not hardlink or not others:
        return
    newest = max(others, key=lambda p: p.stat().st_mtime)
    subprocess.run([hardlink, "-q", str(rootfs), str(newest)], capture_output=True, timeout=CLI_TIMEOUT_S)


@contextmanager
def _container(engine: Engine, ref: str) -> Iterator[str]:
    """A created (never started) container of the image, removed after."""
    name = f"polar-files-{uuid.uuid4().hex[:12]}"
    engine.run(["create", "--name", name, "--network", "none", ref, "true"])
    try:
        yield name
    finally:
        engine.run(["rm", "-f", name], check=False)


def _untar(engine: Engine, args: list[str], dest: Path) -> None:
    """The engine command's tar stream on stdout, unpacked under `dest` by tarfile's `tar` filter."""
    CLI_CWD.mkdir(mode=0o700, exist_ok=True)
    with subprocess.Popen([*engine.base(), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          env=engine.env(), cwd=CLI_CWD) as proc:
        assert proc.stdout is not None
        try:
            with tarfile.open(fileobj=proc.stdout, mode="r|") as tar:
                tar.extractall(dest, filter="tar")
        except (tarfile.TarError, OSError) as e:
            proc.kill()
            raise SandboxError(f"`{engine.kind} {' '.join(args)}`: unreadable image archive: {e}") from e
        try:
            err = proc.communicate(timeout=CLI_TIMEOUT_S)[1]
        except subprocess.TimeoutExpired:
            proc.kill()
            raise SandboxError(f"`{engine.kind} {' '.join(args)}` hung") from None
    if proc.returncode != 0:
        raise SandboxError(f"`{engine.kind} {' '.join(args)}` failed: {err.decode(errors='replace')[-300:]}")


def _sanitise(folder: Path) -> None:
    """No setuid/setgid bit, no device or fifo in a workspace seed (it is copied into every sample)."""
    for dirpath, dirs, files in os.walk(folder):
        for name in dirs + files:
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            if not (os.path.isdir(path) or os.path.islink(path) or os.path.isfile(path)):
                os.unlink(path)
            elif not os.path.islink(path) and st.st_mode & 0o6000:
                os.chmod(path, st.st_mode & 0o1777)
