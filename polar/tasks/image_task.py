"""A task as the runtime that runs it sees it (issue 43): an OCI image's workdir, files and variables
(polar/sandbox/image_files.py) folded into the TaskSpec once, at prepare, so every later stage (the harness, the
verifier's pristine workspace, the oracle) reads them from the sample's state."""
from __future__ import annotations

import dataclasses
from types import MappingProxyType
from typing import Any

from polar.sandbox.docker import find_engine, image_ref
from polar.sandbox.image_files import inspect_image, root_filesystem, workdir_files
from polar.sandbox.runtime import SandboxError, names_oci_image
from polar.tasks.task import TaskSpec

IMAGE_RUNTIMES = ("docker", "apptainer")  # the runtimes that run a task's OCI image


def resolve_image_task(task: TaskSpec, runtime: str) -> TaskSpec:
    """The task as `runtime` runs it: for an OCI image on the docker or apptainer runtime, the engine's name of the
    image (a Dockerfile built once), the workdir (task.toml's, else the image's WORKDIR), the workspace seeded from
    the image's files there (unless the task brings its own), the image's variables under the task's; Apptainer
    gets the image as a root filesystem directory. Any other task is returned as it is."""
    if runtime not in IMAGE_RUNTIMES or not names_oci_image(task.image):
        return task
    try:
        engine = find_engine()
    except SandboxError as e:
        raise SandboxError(f"{runtime} runtime: image {task.image} is an OCI image, which needs podman or docker on "
                           f"this node: {e}") from None
    try:
        facts = inspect_image(engine, image_ref(engine, task.image))
    except SandboxError as e:  # the engine builds or pulls the image for Apptainer too: name the runtime in use
        raise SandboxError(str(e).replace("docker runtime:", f"{runtime} runtime:", 1)) from None
    workdir = task.workdir or facts.workdir
    variables = {**facts.env, **task.env}
    changes: dict[str, Any] = {"image": facts.ref, "workdir": workdir, "env": MappingProxyType(variables),
                     "evaluator": dataclasses.replace(task.evaluator, env=MappingProxyType(
                         {**variables, **task.evaluator.env}))}
    if workdir and task.workspace is None:
        changes["workspace"] = workdir_files(engine, facts, workdir)
    if runtime == "apptainer":
        changes["image"] = str(root_filesystem(engine, facts))
    return dataclasses.replace(task, **changes)
