"""The Apptainer runtime (polar/sandbox/apptainer.py) on the demo image that `make setup` builds: only loopback
inside, the proxy reachable through a socket bridge and nothing else, host files outside the binds invisible, a
timeout stops the command, stop ends the instance, a missing image is named."""
from __future__ import annotations

import os
import re
import socket
import subprocess
import threading
from pathlib import Path
from typing import Iterator

import pytest

from polar.sandbox.bridge import UnixToTcp
from polar.sandbox.runtime import Mounts, SandboxError, get_runtime
from polar.sandbox.apptainer import ApptainerSandbox, apptainer_bin

ROOT = Path(__file__).resolve().parents[3]
IMAGE = ROOT / ".cache" / "images" / "polar-tasks" / "rootfs"

PROBE = r"""
import os, socket, sys
port = int(sys.argv[1])
def tcp(p):
    try:
        socket.create_connection(("127.0.0.1", p), timeout=3).close(); return "open"
    except OSError as e:
        return type(e).__name__
def dns(name):
    try:
        socket.getaddrinfo(name, 443); return "resolved"
    except OSError as e:
        return type(e).__name__
print("ifaces", sorted(n for _, n in socket.if_nameindex()))
print("tcp", tcp(port))
print("dns", dns("example.com"))
for p in sys.argv[2:]:
    print("exists", p, os.path.exists(p))
"""


def demo_image() -> Path:
    if not (IMAGE / "usr" / "bin" / "python3").exists():
        pytest.fail(f"demo image {IMAGE} missing (make setup builds it: scripts/build_image.sh)")
    return IMAGE


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory) -> Iterator[ApptainerSandbox]:
    base = tmp_path_factory.mktemp("apptainer")
    mounts = Mounts(base / "home", base / "workspace", base / "shared")
    for d in (mounts.home, mounts.workspace, mounts.shared):
        d.mkdir()
    box = get_runtime("apptainer").prepare(mounts, image=str(demo_image()))
    yield box
    box.stop()


@pytest.fixture
def host_listener() -> Iterator[int]:
    """A TCP listener on the host's 127.0.0.1 that answers "hello"."""
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            conn.sendall(b"hello")
            conn.close()

    threading.Thread(target=serve, daemon=True).start()
    yield port
    server.close()


def run(box: ApptainerSandbox, argv: list[str], tmp_path: Path, forwards=(), timeout: float = 60) -> tuple[int, str]:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(box.mounts.home)}
    result = box.exec(argv, env, box.mounts.workspace, timeout, tmp_path / "out", tmp_path / "err", forwards)
    return result.exit_code, (tmp_path / "out").read_text() + (tmp_path / "err").read_text()


def test_only_loopback_no_host_port_no_dns(sandbox, host_listener, tmp_path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("host only")
    code, out = run(sandbox, ["python3", "-c", PROBE, str(host_listener), str(secret), str(ROOT / "README.md"),
                              "/root", str(sandbox.mounts.workspace)], tmp_path)
    assert code == 0, out
    assert "ifaces ['lo']" in out
    assert "tcp ConnectionRefusedError" in out  # the host's listener is not reachable from inside
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


def test_binds_writable_root_read_only(sandbox, tmp_path) -> None:
    code, out = run(sandbox, ["sh", "-c", "echo hi > made.txt && touch /usr/x; echo rc=$?; node -e "
                                          "'console.log(process.version)'"], tmp_path)
    assert code == 0, out
    assert (sandbox.mounts.workspace / "made.txt").read_text() == "hi\n"
    assert "rc=1" in out  # the image itself is read-only
    assert re.search(r"^v\d+\.\d+", out, re.M), out  # the host's node runs inside (bound read-only)


def test_timeout_stops_the_command(sandbox, tmp_path) -> None:
    env = {"PATH": "/usr/bin:/bin"}
    result = sandbox.exec(["sleep", "60"], env, sandbox.mounts.workspace, 2, tmp_path / "o", tmp_path / "e")
    assert result.timed_out


def test_stop_ends_the_instance(tmp_path) -> None:
    mounts = Mounts(tmp_path, tmp_path, tmp_path)
    box = get_runtime("apptainer").prepare(mounts, image=str(demo_image()))
    listed = lambda: subprocess.run([str(apptainer_bin()), "instance", "list"], capture_output=True, text=True).stdout
    assert box.name in listed()
    box.stop()
    assert box.name not in listed()
    box.stop()  # twice is fine


def test_missing_image_is_named(tmp_path) -> None:
    missing = tmp_path / "no-such-image.sif"
    with pytest.raises(SandboxError, match=f"image {missing} not found"):
        get_runtime("apptainer").prepare(Mounts(tmp_path, tmp_path, tmp_path), image=str(missing))


@pytest.mark.skipif(os.geteuid() != 0, reason="a SIF needs root here (rootless: /dev/fuse)")
def test_sif_image_as_root(tmp_path) -> None:
    sif = demo_image().parent / "image.sif"
    box = get_runtime("apptainer").prepare(Mounts(tmp_path, tmp_path, tmp_path), image=str(sif))
    try:
        code, out = run(box, ["python3", "-c", "import pytest; print('pytest', pytest.__version__)"], tmp_path)
    finally:
        box.stop()
    assert code == 0 and out.startswith("pytest "), out
