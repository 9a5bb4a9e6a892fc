"""The socket bridge (issue 24): one event loop per forwarder, not a thread per connection, and a cap on
concurrent connections beyond which a client is refused; a connection within the cap round-trips data."""
from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Iterator

import pytest

from polar.sandbox import bridge
from polar.sandbox.bridge import MAX_CONNECTIONS, UnixToTcp, tcp_to_unix


@pytest.fixture
def echo_port() -> Iterator[int]:
    """A TCP echo server on 127.0.0.1, on its own event loop in one thread (so it adds one thread, not many)."""
    loop = asyncio.new_event_loop()

    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
        writer.close()

    server = loop.run_until_complete(asyncio.start_server(echo, "127.0.0.1", 0, backlog=1024))
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield server.sockets[0].getsockname()[1]
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)
    server.close()


def round_trip(connect, payload: bytes) -> bytes | None:
    """What comes back for `payload`, or None when the bridge closed the connection (refused)."""
    s = connect()
    s.settimeout(10)
    try:
        s.sendall(payload)
        s.shutdown(socket.SHUT_WR)
        got = b""
        while data := s.recv(65536):
            got += data
        return got or None
    except (ConnectionResetError, BrokenPipeError):
        return None
    finally:
        s.close()


def unix_client(path: Path):
    def connect() -> socket.socket:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(str(path))
        return s
    return connect


def answer(s: socket.socket) -> bytes | None:
    try:
        return s.recv(16) or None
    except ConnectionResetError:
        return None


def test_600_connections_cost_no_threads_and_the_excess_is_refused(tmp_path, echo_port):
    before = threading.active_count()
    bridge = UnixToTcp(tmp_path / "svc.sock", "127.0.0.1", echo_port)
    clients = []
    try:
        for i in range(600):
            s = unix_client(bridge.path)()
            s.settimeout(10)
            try:
                s.sendall(b"ping")
            except (BrokenPipeError, ConnectionResetError):
                pass  # refused and closed before the ping went out (a loaded machine): answer() reads None
            clients.append(s)
        answers = [answer(s) for s in clients]
        assert threading.active_count() - before <= 2  # the bridge's one loop thread
        assert answers.count(b"ping") == MAX_CONNECTIONS  # the first 64 are spliced and stay open
        assert answers.count(None) == 600 - MAX_CONNECTIONS  # the rest were closed at once, never queued
        for s in clients:
            s.close()
        deadline = time.monotonic() + 10  # the bridge sees the 64 hang up
        while (got := round_trip(unix_client(bridge.path), b"x" * 300000)) is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert got == b"x" * 300000  # a normal connection round-trips again, big payload whole
    finally:
        for s in clients:
            s.close()
        bridge.close()
    assert threading.active_count() <= before  # close() ends the loop's thread


def test_the_cap_is_an_argument_and_close_ends_open_connections(tmp_path, echo_port):
    bridge = UnixToTcp(tmp_path / "svc.sock", "127.0.0.1", echo_port, limit=2)
    held = [unix_client(bridge.path)() for _ in range(2)]
    for s in held:
        s.settimeout(10)
        s.sendall(b"a")
        assert s.recv(1) == b"a"
    assert round_trip(unix_client(bridge.path), b"third") is None
    bridge.close()
    for s in held:
        assert answer(s) is None  # ended by close()
        s.close()


def test_tcp_to_unix_reaches_a_socket_through_both_sides(tmp_path, echo_port):
    """The in-sandbox side (TCP -> socket file) in front of the host side (socket file -> TCP), as in a run."""
    host = UnixToTcp(tmp_path / "svc.sock", "127.0.0.1", echo_port)
    probe = socket.create_server(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    inside = tcp_to_unix("127.0.0.1", port, str(host.path))
    try:
        results = [round_trip(lambda: socket.create_connection(("127.0.0.1", port)), b"hello %d" % i)
                   for i in range(20)]
        assert results == [b"hello %d" % i for i in range(20)]
    finally:
        inside.close()
        host.close()


def test_the_script_runs_its_command_with_the_status_signals_and_descriptors_popen_gave(tmp_path, echo_port):
    """bridge.py as the sandbox runs it (`python3 -I -S`, spawning the command itself): the command reaches the
    forward, its exit status comes back, a SIGTERM to the forwarder reaches it, and a descriptor the forwarder
    was handed is not the command's."""
    host = UnixToTcp(tmp_path / "svc.sock", "127.0.0.1", echo_port)
    port = socket.create_server(("127.0.0.1", 0)).getsockname()[1]  # a free port for the inside listener
    handed = os.open(tmp_path, os.O_RDONLY)  # inheritable: passed to the forwarder below
    script = (f"python3 -c \"import socket; s = socket.create_connection(('127.0.0.1', {port})); s.sendall(b'x');"
              f" print(s.recv(4).decode())\"; [ -e /proc/self/fd/{handed} ] && echo leaked; exit 7")
    forwarder = ["/usr/bin/python3", "-I", "-S", bridge.__file__, "--forward", f"{port}={tmp_path / 'svc.sock'}"]
    try:
        done = subprocess.run([*forwarder, "--", "sh", "-c", script], capture_output=True, text=True, timeout=30,
                              pass_fds=(handed,))
        assert (done.returncode, done.stdout) == (7, "x\n"), done.stderr
        # The forwarder blocks SIGTERM until its handler is in place; the command starts with nothing blocked.
        blocked = subprocess.run([*forwarder, "--", "grep", "^SigBlk", "/proc/self/status"], capture_output=True,
                                 text=True, timeout=30).stdout.split()
        assert blocked[1:] and int(blocked[1], 16) == 0, blocked
        # SIGTERM right after the command starts (it was once lost while the forwarder set up its handler).
        for _ in range(5):
            proc = subprocess.Popen([*forwarder, "--", "sh", "-c", "trap 'exit 42' TERM; echo up; sleep 30 & wait"],
                                    stdout=subprocess.PIPE, text=True)
            assert proc.stdout.readline() == "up\n"
            proc.terminate()
            assert proc.wait(10) == 42
    finally:
        os.close(handed)
        host.close()
