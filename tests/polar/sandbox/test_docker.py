"""The container runtime (polar/sandbox/docker.py) with the engine `make setup` installs (podman): only loopback
inside, the proxy through a socket bridge, no host file outside the binds, the root read-only, every image form
(the demo's root filesystem directory, a tag, a `docker save` tarball), and no container left after a normal
end, a timeout, or a stage that died (leftovers by label). The isolation tests (test_isolation.py) run the
escape attempts, the fork bomb, the memory hog and the privilege probes in it as in the other runtimes."""
from __future__ import annotations

import os
import re
import shutil
import time
import uuid
from pathlib import Path
from typing import Iterator

import pytest

from polar.sandbox import docker
from polar.sandbox.bridge import UnixToTcp
from polar.sandbox.docker import DockerRuntime, DockerSandbox, Engine, find_engine
from polar.sandbox.runtime import Mounts, SandboxError, get_runtime, names_oci_image, resolve_runtime
from tests.polar.sandbox.test_apptainer import PROBE, ROOT, demo_image, host_listener  # noqa: F401 - fixture


def require_engine() -> Engine:
    """The engine, or a skip saying why none can run (make setup installs podman)."""
    try:
        return find_engine()
    except SandboxError as e:
        pytest.skip(f"no container engine can run here: {e}")


def names(engine: Engine) -> set[str]:
    out = engine.run(["ps", "-a", "--filter", f"label={docker.LABEL}", "--format", "{{.Names}}"]).stdout
    return set(out.split())


def mounts_in(base: Path) -> Mounts:
    m = Mounts(base / "home", base / "workspace", base / "shared")
    for d in (m.home, m.workspace, m.shared):
        d.mkdir(parents=True, exist_ok=True)
    return m


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory) -> Iterator[DockerSandbox]:
    require_engine()
    box = get_runtime("docker").prepare(mounts_in(tmp_path_factory.mktemp("docker")), image=str(demo_image()))
    yield box
    box.stop()


def run(box: DockerSandbox, argv: list[str], tmp_path: Path, forwards=(), timeout: float = 60) -> tuple[int, str]:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(box.mounts.home)}
    result = box.exec(argv, env, box.mounts.workspace, timeout, tmp_path / "out", tmp_path / "err", forwards)
    return result.exit_code, (tmp_path / "out").read_text() + (tmp_path / "err").read_text()


def test_only_loopback_no_host_port_no_dns(sandbox, host_listener, tmp_path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("host only")
    code, out = run(sandbox, ["python3", "-c", PROBE, str(host_listener), str(secret), str(ROOT / "README.md"),
                              "/root/.bashrc", str(sandbox.mounts.workspace)], tmp_path)
    assert code == 0, out
    assert "ifaces ['lo']" in out
    assert "tcp ConnectionRefusedError" in out
    assert "dns gaierror" in out
    assert f"exists {secret} False" in out and f"exists {ROOT / 'README.md'} False" in out
    assert f"exists {sandbox.mounts.workspace} True" in out


def test_proxy_reached_through_the_socket_bridge(sandbox, host_listener, tmp_path) -> None:
    sock = sandbox.mounts.shared / "proxy.sock"
    bridge = UnixToTcp(sock, "127.0.0.1", host_listener)
    try:
        code, out = run(sandbox, ["python3", "-c", f"import socket; print(socket.create_connection(('127.0.0.1', "
                                                   f"{host_listener})).recv(5).decode())"],
                        tmp_path, forwards=[(host_listener, sock)])
    finally:
        bridge.close()
    assert code == 0 and out.strip() == "hello", out


CAP_BITS = {"CHOWN": 0, "DAC_OVERRIDE": 1, "FOWNER": 3, "FSETID": 4, "KILL": 5, "SETGID": 6, "SETUID": 7,
            "NET_BIND_SERVICE": 10}  # linux/capability.h


def test_root_read_only_binds_writable_few_capabilities(sandbox, tmp_path) -> None:
    """podman: root inside (the image's user) with ROOT_CAPS in its namespace, a subordinate uid outside;
    docker: polar-sandbox (or the caller) with no capability. Both: the root read-only, no new privileges."""
    script = ("echo hi > made.txt; touch /usr/x /etc/x /x; echo rc=$?; node -e 'console.log(process.version)'; "
              "grep CapEff /proc/self/status; grep NoNewPrivs /proc/self/status; id -u; echo t > /tmp/t && echo tmp-ok")
    code, out = run(sandbox, ["sh", "-c", script], tmp_path)
    assert code == 0, out
    made = sandbox.mounts.workspace / "made.txt"
    assert made.read_text() == "hi\n"
    assert "rc=1" in out and out.count("Read-only file system") == 3, out
    assert re.search(r"^v\d+\.\d+", out, re.M), out  # the host's node, bound read-only
    assert "NoNewPrivs:\t1" in out and "tmp-ok" in out
    caps = int(re.search(r"CapEff:\t([0-9a-f]+)", out)[1], 16)
    if sandbox.engine.kind == "podman":
        assert caps == sum(1 << CAP_BITS[name] for name in docker.ROOT_CAPS), out
        assert "\n0\n" in out, out  # root inside
    else:
        assert caps == 0, out
    if os.geteuid() == 0:
        from polar.sandbox.identity import sandbox_identity, subordinate_range

        if sandbox.engine.kind == "podman":  # the container's root is polar-sandbox's first subordinate id
            assert made.stat().st_uid == subordinate_range().uid != 0
        else:
            assert f"\n{sandbox_identity().uid}\n" in out  # polar-sandbox, the host's uid too


def test_the_sample_home_starts_with_the_image_users_home(tmp_path) -> None:
    """Root's build-time dotfiles (the demo image's /root/.bashrc) are in the sample's HOME; a file Polar put
    there first is kept."""
    engine = require_engine()
    if engine.kind != "podman":
        pytest.skip("the image's user runs only under podman (docker: polar-sandbox)")
    m = mounts_in(tmp_path)
    (m.home / ".bashrc").write_text("# Polar's own\n")
    box = get_runtime("docker").prepare(m, image=str(demo_image()))
    try:
        code, out = run(box, ["sh", "-c", "id -u; cat ~/.profile | head -1; cat ~/.bashrc"], tmp_path)
    finally:
        box.stop()
    image_profile = (demo_image() / "root" / ".profile").read_text().splitlines()[0]
    assert code == 0 and out.splitlines()[:3] == ["0", image_profile, "# Polar's own"], out


def test_secrets_stay_off_the_command_line(sandbox, tmp_path) -> None:
    """The sandbox's environment reaches it through a private env file, never the engine's argv."""
    env = {"PATH": "/usr/bin:/bin", "TOKEN": "s3cret-token", "MULTI": "a\nb"}
    result = sandbox.exec(["sh", "-c", 'echo "$TOKEN"; printf "%s" "$MULTI"; cat /proc/1/cmdline /proc/self/cmdline'],
                          env, sandbox.mounts.workspace, 60, tmp_path / "o", tmp_path / "e")
    out = (tmp_path / "o").read_text()
    assert result.exit_code == 0 and out.startswith("s3cret-token\na\nb"), out
    assert out.count("s3cret-token") == 1


def test_a_timeout_kills_what_the_exec_started(sandbox, tmp_path) -> None:
    tag = 3000 + int(uuid.uuid4().hex[:4], 16) % 5000
    result = sandbox.exec(["sh", "-c", f"sleep {tag} & sleep {tag + 1}"], {"PATH": "/usr/bin:/bin"},
                          sandbox.mounts.workspace, 2, tmp_path / "o", tmp_path / "e")
    assert result.timed_out and result.reaped >= 2, result
    code, out = run(sandbox, ["sh", "-c", "ps -eo args"], tmp_path)
    assert f"sleep {tag}" not in out, out


def test_container_gone_after_stop_and_leftovers_removed(tmp_path) -> None:
    engine = require_engine()
    runtime = get_runtime("docker")
    box = runtime.prepare(mounts_in(tmp_path / "a"), image=str(demo_image()))
    assert box.name in names(engine)
    box.stop()
    box.stop()  # twice is fine
    assert box.name not in names(engine)
    # A stage that died (a worker's SIGKILL) leaves its container; its sample folder goes, the next prepare on
    # the node removes it.
    dead = runtime.prepare(mounts_in(tmp_path / "b"), image=str(demo_image()))
    shutil.rmtree(tmp_path / "b")
    other = runtime.prepare(mounts_in(tmp_path / "c"), image=str(demo_image()))
    try:
        assert dead.name not in names(engine) and other.name in names(engine)
    finally:
        other.stop()


def test_image_forms(tmp_path) -> None:
    """A root filesystem directory (imported once), its tag, and a `docker save` tarball (loaded) all run;
    a SIF or a missing path is named."""
    engine = require_engine()
    rootfs = tmp_path / "rootfs"
    (rootfs / "bin").mkdir(parents=True)
    shutil.copy("/bin/busybox", rootfs / "bin" / "busybox")
    for applet in ("sh", "sleep", "cat", "kill", "echo", "id"):
        (rootfs / "bin" / applet).symlink_to("busybox")
    tag = f"polar-test-busybox:{uuid.uuid4().hex[:8]}"
    ref = docker.import_rootfs(engine, rootfs, tag)
    tarball = tmp_path / "image.tar"
    engine.run(["save", "-o", str(tarball), tag])
    engine.run(["rmi", tag])
    try:
        for image in (str(rootfs), str(tarball), tag):  # the tarball loads `tag` back
            box = DockerRuntime().prepare(mounts_in(tmp_path / "m"), image=image)
            try:
                result = box.exec(["sh", "-c", "echo from-$0"], {}, box.mounts.workspace, 60, tmp_path / "o",
                                  tmp_path / "e")
                assert result.exit_code == 0 and (tmp_path / "o").read_text() == "from-sh\n", image
            finally:
                box.stop()
    finally:
        engine.run(["rmi", "-f", tag, ref], check=False)
    with pytest.raises(SandboxError, match="a SIF is Apptainer's"):
        DockerRuntime().prepare(mounts_in(tmp_path / "m"), image=str(demo_image().parent / "image.sif"))
    with pytest.raises(SandboxError, match="not found"):
        DockerRuntime().prepare(mounts_in(tmp_path / "m"), image=str(tmp_path / "missing.tar"))


def test_auto_picks_the_engine_for_an_oci_image() -> None:
    assert names_oci_image("docker://debian:12") and names_oci_image("polar-tasks:local")
    assert names_oci_image("/images/x.tar") and not names_oci_image(str(demo_image()))
    assert not names_oci_image("host") and not names_oci_image("/images/task.sif")
    if shutil.which("podman") or shutil.which("docker"):
        assert resolve_runtime("auto", "polar-tasks:local") == "docker"
    assert resolve_runtime("auto", str(demo_image())) in ("apptainer", "bwrap")
    with pytest.raises(SandboxError, match="POLAR_DOCKER='lxc'"):
        find_engine("lxc")


def test_start_and_teardown_are_quick(tmp_path) -> None:
    """Start to first exec and teardown, printed for bench/sandbox.py's row (bounds generous: 2 shared cores)."""
    require_engine()
    start = time.monotonic()
    box = get_runtime("docker").prepare(mounts_in(tmp_path), image=str(demo_image()))
    result = box.exec(["true"], {}, box.mounts.workspace, 60, tmp_path / "o", tmp_path / "e")
    first = time.monotonic() - start
    start = time.monotonic()
    box.stop()
    teardown = time.monotonic() - start
    print(f"docker runtime: start to first exec {first:.2f} s, teardown {teardown:.2f} s")
    assert result.exit_code == 0 and first < 20 and teardown < 20
