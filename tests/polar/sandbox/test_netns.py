"""The network namespace a root node makes for a bwrap sandbox (polar/sandbox/netns.py): loopback only, the
proxy's ports listening inside and spliced to the socket files by the node, no forwarder process in the sandbox,
and nothing left once closed."""
from __future__ import annotations

import os
import socket
import subprocess

import pytest

from polar.sandbox import netns
from polar.sandbox.bridge import UnixToTcp
from polar_mitm.launch import free_port
from tests.polar.sandbox.test_apptainer import host_listener  # noqa: F401 (a fixture)
from tests.polar.sandbox.test_runtime import host_service, mounts, run  # noqa: F401 (fixtures)


@pytest.fixture(autouse=True)
def as_root():
    if netns.nsenter() is None:
        pytest.fail("make test runs as root with util-linux's nsenter: the node's own namespace is what runs here")


def test_loopback_only_and_the_listeners_reach_the_socket_files(tmp_path, host_listener):  # noqa: F811
    bridge = UnixToTcp(tmp_path / "a.sock", "127.0.0.1", host_listener)
    port = free_port()
    net = netns.loopback_net([(port, tmp_path / "a.sock")])
    try:
        script = ("cat /proc/net/dev | sed -n '3,$p' | cut -d: -f1 | tr -d ' '; python3 -c \"import socket as s; "
                  "print(s.create_connection(('127.0.0.1', %d)).recv(5).decode())\"" % port)
        out = subprocess.run(["nsenter", f"--net={net.path}", "--", "sh", "-c", script], capture_output=True,
                             text=True, timeout=30)
        assert out.stdout.split() == ["lo", "hello"], out.stderr
        with socket.socket() as s:  # the port it listens on inside is free on the host meanwhile
            s.bind(("127.0.0.1", port))
    finally:
        net.close()
        bridge.close()
    with pytest.raises(OSError):
        os.fstat(net.fd)  # the namespace's descriptor is closed
    assert all(f.listener.fileno() == -1 and not f.thread.is_alive() for f in net.forwarders)


def test_a_bwrap_sandbox_as_root_holds_no_forwarder_process(mounts, host_service):  # noqa: F811
    bridge = UnixToTcp(mounts.shared / "svc.sock", "127.0.0.1", host_service)
    script = (f"python3 -c \"import urllib.request as u; print(u.urlopen('http://127.0.0.1:{host_service}/').status)\";"
              "cat /proc/[0-9]*/cmdline | tr '\\0' ' '")
    try:
        result, out, err = run("bwrap", mounts, script, [(host_service, mounts.shared / "svc.sock")])
    finally:
        bridge.close()
    assert result.exit_code == 0, err
    assert out.splitlines()[0] == "200"
    assert "bridge.py --forward" not in out  # the node listens in the namespace; no forwarder beside the harness
