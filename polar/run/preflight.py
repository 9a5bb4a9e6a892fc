"""What a task needs that this node lacks, said once, before anything starts: GPUs, a runtime, a container
engine, the task's image or its Dockerfile's base images (a task that asks for the internet needs nothing more:
its agent runs offline, its verifier through the egress proxy, polar/sandbox/egress.py). Each
line names the flag or setting that provides it, so a first run on a bare node takes one try, not four
(`polar run --task`); a sample prepared on a node that lacks GPUs fails there the same way (polar/run/sample.py).
"""
from __future__ import annotations

import glob
from pathlib import Path

from polar.sandbox.runtime import SandboxError, names_oci_image, resolve_runtime
from polar.tasks.task import TaskSpec


def node_gpus() -> int:
    return len(glob.glob("/dev/nvidia[0-9]*"))


def gpu_shortfall(task: TaskSpec) -> str | None:
    here = node_gpus()
    if task.gpus > here:
        return f"{task.gpus} GPU(s) ([environment] gpus); this node has {here}: run it on a GPU node"
    return None


def lacks(task: TaskSpec, runtime: str) -> list[str]:
    """One line per thing `task` needs that this node lacks (none: it can run here)."""
    found = []
    if (gpus := gpu_shortfall(task)) is not None:
        found.append(gpus)
    try:
        name = resolve_runtime(runtime, task.image)
    except (SandboxError, ValueError) as e:
        return [*found, f"a runtime: {e}"]
    if name in ("docker", "apptainer") and names_oci_image(task.image):
        found += _image_lacks(task.image, name)
    return found


def _image_lacks(image: str, runtime: str) -> list[str]:
    """The OCI image, or a Dockerfile's base images, this node cannot provide without a pull it may not make."""
    from polar.sandbox.build_context import ContextError, pull_policy
    from polar.sandbox.docker import dockerfile_bases, find_engine, local_name
    from polar.sandbox.image_names import MAP_ENV, image_map, mapped, qualified

    try:
        engine = find_engine()
        table, policy = image_map(), pull_policy()
    except (SandboxError, ContextError, ValueError) as e:
        return [f"{runtime} runtime: image {image} needs podman or docker on this node ({e}; make setup installs "
                "podman)" if isinstance(e, SandboxError) else f"{runtime} runtime: {e}"]
    path = Path(image)
    if path.name == "Dockerfile":
        refs = [(f"base image {b} of {image}", b) for b in dockerfile_bases(path.read_text(errors="replace"))]
    elif path.exists():
        return []
    else:
        refs = [(f"image {image}", image.removeprefix("docker://"))]
    found = []
    for what, ref in refs:
        if policy == "never" and local_name(engine, ref, table) is None:
            source = mapped(ref, table) or qualified(ref)
            found.append(f"{what} is not on this node: `{engine.kind} pull {source}` (or `load`) it here, set "
                         f"POLAR_PULL=missing to let samples pull it, or map it in {MAP_ENV} (NAME=REF)")
    return found


def first_message(task: TaskSpec, problems: list[str]) -> str:
    """The one message for all of them."""
    lines = [f"task {task.task_id} needs what this node lacks:"] + [f"  - {p}" for p in problems]
    return "\n".join(lines)
