"""Image inputs a task brings (issue 41, polar/sandbox/build_context.py and docker.py's use of it): a Dockerfile's
build context is hashed within caps, a 64 GiB sparse file refused at once without being read; a missing image is
pulled only when POLAR_PULL=missing. The engine here is a script that records its arguments (no registry)."""
from __future__ import annotations

import time
import tracemalloc
from pathlib import Path

import pytest

from polar.sandbox.build_context import DEFAULT_MAX_BYTES, Caps, ContextError, context_digest
from polar.sandbox.docker import Engine, build_dockerfile, image_ref
from polar.sandbox.runtime import SandboxError


def recording_engine(tmp_path: Path, answer: int = 1) -> tuple[Engine, Path]:
    """A `podman` that logs each call and exits `answer` (1: no such image, the pull fails)."""
    log, cli = tmp_path / "calls.log", tmp_path / "podman"
    cli.write_text(f'#!/bin/sh\necho "$@" >> {log}\nexit {answer}\n')
    cli.chmod(0o755)
    return Engine("podman", str(cli)), log


def context(tmp_path: Path) -> Path:
    ctx = tmp_path / "environment"
    ctx.mkdir()
    (ctx / "Dockerfile").write_text("FROM polar-tasks:local\nCOPY . /opt\n")
    (ctx / "data.txt").write_text("one\n")
    return ctx


def test_a_sparse_64_gib_file_is_refused_fast_without_being_read(tmp_path: Path, monkeypatch):
    monkeypatch.delenv("POLAR_BUILD_CONTEXT_MAX_BYTES", raising=False)
    ctx = context(tmp_path)
    with open(ctx / "huge.img", "wb") as f:
        f.truncate(64 << 30)
    engine, log = recording_engine(tmp_path)
    tracemalloc.start()
    t0 = time.monotonic()
    with pytest.raises(SandboxError) as e:
        build_dockerfile(engine, ctx / "Dockerfile")
    spent, (_now, peak) = time.monotonic() - t0, tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert str(e.value) == (f"docker runtime: {ctx / 'Dockerfile'}: build context {ctx}: more than "
                            f"{DEFAULT_MAX_BYTES} bytes (at huge.img, {64 << 30} bytes; raise "
                            "POLAR_BUILD_CONTEXT_MAX_BYTES to allow more)")
    assert spent < 2 and peak < 8 << 20, (spent, peak)
    assert not log.exists()  # refused before the engine was asked anything


def test_sparse_files_within_the_cap_are_hashed_in_bounded_memory(tmp_path: Path):
    ctx = context(tmp_path)
    with open(ctx / "sparse.img", "wb") as f:
        f.truncate(64 << 20)
    tracemalloc.start()
    digest = context_digest(ctx, Caps(max_bytes=128 << 20))
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 8 << 20, peak  # chunks, never the whole 64 MiB
    assert digest == context_digest(ctx, Caps(max_bytes=128 << 20))
    (ctx / "data.txt").write_text("two\n")
    assert context_digest(ctx, Caps(max_bytes=128 << 20)) != digest


def test_links_are_hashed_not_followed_and_the_file_count_is_capped(tmp_path: Path, monkeypatch):
    ctx = context(tmp_path)
    outside = tmp_path / "outside.img"
    with open(outside, "wb") as f:
        f.truncate(64 << 30)
    (ctx / "link").symlink_to(outside)
    (ctx / "dir-link").symlink_to(tmp_path)
    assert len(context_digest(ctx, Caps())) == 64  # the 64 GiB target is never read, the folder never walked
    for i in range(5):
        (ctx / f"f{i}").write_text(str(i))
    with pytest.raises(ContextError, match=r"more than 6 files \(raise POLAR_BUILD_CONTEXT_MAX_FILES to allow more\)"):
        context_digest(ctx, Caps(max_files=6))
    monkeypatch.setenv("POLAR_BUILD_CONTEXT_MAX_FILES", "6")
    with pytest.raises(SandboxError, match="more than 6 files"):
        build_dockerfile(recording_engine(tmp_path)[0], ctx / "Dockerfile")


def test_a_missing_image_is_not_pulled_by_default(tmp_path: Path, monkeypatch):
    monkeypatch.delenv("POLAR_PULL", raising=False)
    engine, log = recording_engine(tmp_path)
    with pytest.raises(SandboxError) as e:
        image_ref(engine, "registry.invalid/nowhere:1")
    assert str(e.value) == ("docker runtime: image registry.invalid/nowhere:1 is not on this node and POLAR_PULL is "
                            "never (the default): `podman pull registry.invalid/nowhere:1` (or `load`) it here "
                            "first, or set POLAR_PULL=missing to let samples pull, or map registry.invalid/"
                            "nowhere:1 to a reachable one in POLAR_IMAGE_MAP")
    assert "pull" not in log.read_text()
    monkeypatch.setenv("POLAR_PULL", "missing")
    with pytest.raises(SandboxError, match="podman pull --quiet` failed"):
        image_ref(engine, "docker://registry.invalid/nowhere:1")
    assert "pull --quiet registry.invalid/nowhere:1" in log.read_text()
    monkeypatch.setenv("POLAR_PULL", "always")
    with pytest.raises(SandboxError, match=r"POLAR_PULL='always': expected one of never, missing"):
        image_ref(engine, "registry.invalid/nowhere:1")


def test_an_executable_bit_makes_another_image(tmp_path: Path):
    """COPY keeps a file's executable bit, so a context differing only there is built again (issue 43: a task's
    script made executable was served from the image built before)."""
    (tmp_path / "run.sh").write_text("#!/bin/sh\n")
    before = context_digest(tmp_path, Caps())
    (tmp_path / "run.sh").chmod(0o755)
    assert context_digest(tmp_path, Caps()) != before
    (tmp_path / "run.sh").chmod(0o644)
    assert context_digest(tmp_path, Caps()) == before
