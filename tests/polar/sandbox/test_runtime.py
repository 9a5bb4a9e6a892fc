"""Runtimes: the sandbox has only loopback, reaches a host TCP service through the unix-socket bridge, passes the
exit status through, and a timeout stops the whole process tree."""
from __future__ import annotations

import http.server
import os
import subprocess
import threading

import pytest

from polar.sandbox.bridge import UnixToTcp
from polar.sandbox.runtime import REGISTRY, Mounts, get_runtime

RUNTIMES = [r for r in REGISTRY if r != "apptainer"]  # apptainer: its own tests; docker: on the demo image


@pytest.fixture
def host_service():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()


@pytest.fixture
def mounts(tmp_path) -> Mounts:
    m = Mounts(tmp_path / "home", tmp_path / "ws", tmp_path / "shared")
    for d in (m.home, m.workspace, m.shared):
        d.mkdir()
    return m


def run(runtime: str, mounts: Mounts, script: str, forwards=(), timeout: float = 60):
    if runtime == "docker":
        from tests.polar.sandbox.test_apptainer import demo_image
        from tests.polar.sandbox.test_docker import require_engine

        require_engine()
        sandbox = get_runtime(runtime).prepare(mounts, image=str(demo_image()))
    else:
        sandbox = get_runtime(runtime).prepare(mounts)
    env = {"PATH": os.environ["PATH"], "HOME": str(mounts.home)}
    out, err = mounts.shared / "out", mounts.shared / "err"
    result = sandbox.exec(["sh", "-c", script], env, mounts.workspace, timeout, out, err, forwards)
    sandbox.stop()
    return result, out.read_text(), err.read_text()


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_only_loopback_and_the_bridge(runtime, mounts, host_service):
    bridge = UnixToTcp(mounts.shared / "svc.sock", "127.0.0.1", host_service)
    script = (f"python3 -c \"import urllib.request as u; print(u.urlopen('http://127.0.0.1:{host_service}/').status)\";"
              "sed -n '3,$p' /proc/net/dev | cut -d: -f1 | tr -d ' '; echo x > out.txt; echo y > $HOME/h.txt;"
              "python3 -c \"import socket; socket.create_connection(('1.1.1.1', 80), timeout=3)\" 2>&1 | tail -1")
    try:
        result, out, _ = run(runtime, mounts, script, [(host_service, mounts.shared / "svc.sock")])
    finally:
        bridge.close()
    lines = out.splitlines()
    assert result.exit_code == 0 and not result.timed_out
    assert lines[0] == "200"  # the host service, through the socket
    assert lines[1:-1] == ["lo"]  # no other interface
    assert "Network is unreachable" in lines[-1]
    assert (mounts.workspace / "out.txt").read_text() == "x\n" and (mounts.home / "h.txt").exists()


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_exit_status_passes_through(runtime, mounts):
    result, out, err = run(runtime, mounts, "echo to-out; echo to-err >&2; exit 7")
    assert (result.exit_code, out, err) == (7, "to-out\n", "to-err\n")


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_timeout_stops_the_tree(runtime, mounts):
    marker = mounts.workspace / "late"
    result, _, _ = run(runtime, mounts, f"(sleep 3; touch {marker}) & sleep 30", timeout=1)
    assert result.timed_out and result.wall_s < 20
    import time
    time.sleep(3.5)
    assert not marker.exists()  # the background child died with the sandbox


def test_bwrap_root_is_read_only(mounts, tmp_path_factory):
    outside = tmp_path_factory.getbasetemp().parent / "polar-bwrap-probe"
    outside.write_text("host /tmp")
    try:
        script = f"touch /usr/polar-x 2>/dev/null || echo read-only; cat {outside} 2>/dev/null || echo hidden"
        result, out, _ = run("bwrap", mounts, script)
    finally:
        outside.unlink()
    assert result.exit_code == 0 and out.split() == ["read-only", "hidden"]


def test_bwrap_etc_reads_as_the_hosts_and_is_read_only(mounts):
    """/etc is the host's files copied once (runtime.etc_copy), bound read-only: what a harness reads there is the
    host's own, and it cannot change them."""
    script = ("cat /etc/passwd /etc/hosts /etc/ld.so.cache | md5sum; ls -A /etc/ssl/certs | md5sum; "
              "readlink /etc/ssl/certs/$(ls /etc/ssl/certs | grep '[.]0$' | head -1); "
              "echo x >> /etc/hosts 2>/dev/null || echo read-only")
    result, out, err = run("bwrap", mounts, script)
    assert result.exit_code == 0, err
    files, certs, link, written = out.splitlines()
    host = subprocess.run(["sh", "-c", script.replace("echo x >> /etc/hosts", "false")], capture_output=True,
                          text=True).stdout.splitlines()
    assert [files, certs, link] == host[:3] and link  # the certificates' links stay links
    assert written == "read-only"


def test_unknown_runtime():
    with pytest.raises(ValueError, match="unknown runtime"):
        get_runtime("kvm")


class Revoked(BaseException):
    pass


def test_a_sigterm_as_the_group_starts_still_stops_it(tmp_path, monkeypatch):
    """A revoke's SIGTERM right after the fork, before the group is watched, must still stop the group."""
    import signal
    import subprocess

    from polar.sandbox import runtime as runtime_module

    def on_term(signum, frame):
        raise Revoked()

    real_popen, started = subprocess.Popen, []

    def popen_then_sigterm(*args, **kwargs):
        proc = real_popen(*args, **kwargs)
        started.append(proc.pid)
        os.kill(os.getpid(), signal.SIGTERM)
        return proc

    previous = signal.signal(signal.SIGTERM, on_term)
    monkeypatch.setattr(runtime_module.subprocess, "Popen", popen_then_sigterm)
    try:
        with pytest.raises(Revoked):
            runtime_module.run_group(["sleep", "30"], dict(os.environ), tmp_path, 60, tmp_path / "out",
                                     tmp_path / "err", None)
        with pytest.raises(ProcessLookupError):
            os.kill(started[0], 0)
    finally:
        signal.signal(signal.SIGTERM, previous)
        if started:
            try:
                os.killpg(started[0], signal.SIGKILL)
            except ProcessLookupError:
                pass
