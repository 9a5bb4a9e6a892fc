"""Images named as tasks name them (polar/sandbox/image_names.py, docker.present): Docker Hub short names are
qualified as Docker qualifies them, and the operator's POLAR_IMAGE_MAP provides an image or a Dockerfile's base
image on a node without Docker Hub. The map is tried with the real podman and the demo image's local tag."""
from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from polar.sandbox.docker import build_dockerfile, present
from polar.sandbox.image_names import image_map, qualified
from polar.sandbox.runtime import SandboxError
from tests.polar.sandbox.test_docker import require_engine

LOCAL = "polar-tasks:local"  # scripts/setup_podman.sh imports the demo image under this tag


@pytest.mark.parametrize("name, full", [
    ("alexgshaw/fix-git:20260403", "docker.io/alexgshaw/fix-git:20260403"),
    ("python:3.13-slim-bookworm", "docker.io/library/python:3.13-slim-bookworm"),
    ("ubuntu", "docker.io/library/ubuntu"),
    ("ghcr.io/org/img:1", "ghcr.io/org/img:1"), ("registry.local:5000/x", "registry.local:5000/x"),
    ("localhost/polar:1", "localhost/polar:1"), ("docker.io/library/python:3", "docker.io/library/python:3")])
def test_short_names_are_qualified_as_docker_does(name, full) -> None:
    assert qualified(name) == full


def test_the_operators_map_reads_pairs_and_files(tmp_path) -> None:
    assert image_map("python:3.13=registry.local/python:3.13, a/b:1 = mirror.local/a/b:1") == {
        "python:3.13": "registry.local/python:3.13", "a/b:1": "mirror.local/a/b:1"}
    (tmp_path / "images").write_text("# node mirror\npython:3.13=registry.local/python:3.13\n\n")
    assert image_map(f"@{tmp_path / 'images'}") == {"python:3.13": "registry.local/python:3.13"}
    with pytest.raises(ValueError, match="expected NAME=REF"):
        image_map("python:3.13")
    with pytest.raises(ValueError, match="cannot read the map"):
        image_map(f"@{tmp_path / 'none'}")


def test_a_missing_short_name_is_named_qualified_with_both_ways_to_provide_it(monkeypatch) -> None:
    engine = require_engine()
    monkeypatch.delenv("POLAR_PULL", raising=False)
    monkeypatch.delenv("POLAR_IMAGE_MAP", raising=False)
    name = f"polar-test-{uuid.uuid4().hex[:8]}/nowhere:1"
    with pytest.raises(SandboxError) as e:
        present(engine, name)
    assert f"`podman pull docker.io/{name}`" in str(e.value) and f"or map {name} to a reachable one in " \
        "POLAR_IMAGE_MAP" in str(e.value)


def test_the_map_provides_an_image_and_a_base_image(tmp_path, monkeypatch) -> None:
    engine = require_engine()
    if engine.run(["image", "exists", LOCAL], check=False).returncode != 0:
        pytest.skip(f"{LOCAL} is not imported on this node (make setup does it)")
    monkeypatch.delenv("POLAR_PULL", raising=False)
    base = f"polar-test-{uuid.uuid4().hex[:8]}/python:3.13-slim-bookworm"  # a Docker Hub name, never pulled
    monkeypatch.setenv("POLAR_IMAGE_MAP", f"alexgshaw/fix-git:20260403={LOCAL},docker.io/{base}={LOCAL}")
    assert present(engine, "alexgshaw/fix-git:20260403") == LOCAL
    (tmp_path / "Dockerfile").write_text(f"FROM {base}\nRUN true\n")
    try:
        tag = build_dockerfile(engine, tmp_path / "Dockerfile")
        assert engine.run(["image", "exists", tag], check=False).returncode == 0
    finally:
        engine.run(["rmi", "-f", base], check=False)
