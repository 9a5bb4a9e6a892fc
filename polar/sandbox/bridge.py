"""Reach the proxy from a network namespace with nothing but loopback (DESIGN.md §6).

A unix socket on the filesystem crosses network namespaces; TCP does not. Outside, `UnixToTcp` listens on a
socket file and connects each client to the proxy's TCP port. Inside, `python -m polar.sandbox.bridge` listens on
127.0.0.1:PORT (the same port numbers, so URLs read the same), connects each client to the socket file, and
runs the harness command once its listeners are up; it exits with the harness's status.
"""
from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Callable

BUFFER = 65536


def _pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(BUFFER):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for s, how in ((dst, socket.SHUT_WR), (src, socket.SHUT_RD)):
            try:
                s.shutdown(how)
            except OSError:
                pass


def _splice(client: socket.socket, connect: Callable[[], socket.socket]) -> None:
    try:
        upstream = connect()
    except OSError:
        client.close()
        return
    back = threading.Thread(target=_pump, args=(upstream, client), daemon=True)
    back.start()
    _pump(client, upstream)
    back.join()
    client.close()
    upstream.close()


class _Forwarder:
    """Accepts on `listener`, splices every client to a fresh `connect()`; one thread per direction."""

    def __init__(self, listener: socket.socket, connect: Callable[[], socket.socket]) -> None:
        self.listener, self.connect = listener, connect
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return  # closed
            threading.Thread(target=_splice, args=(client, self.connect), daemon=True).start()

    def close(self) -> None:
        try:
            self.listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.listener.close()


class UnixToTcp(_Forwarder):
    """Outside the sandbox: socket file -> host:port."""

    def __init__(self, path: Path, host: str, port: int) -> None:
        path.unlink(missing_ok=True)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(path))
        os.chmod(path, 0o666)  # a rootless sandbox user may map to another uid
        listener.listen(128)
        self.path = path
        super().__init__(listener, lambda: socket.create_connection((host, port), timeout=None))


def tcp_to_unix(host: str, port: int, path: str) -> _Forwarder:
    """Inside the sandbox: host:port -> socket file."""
    listener = socket.create_server((host, port), backlog=128)

    def connect() -> socket.socket:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(path)
        return s

    return _Forwarder(listener, connect)


def parse_forward(spec: str) -> tuple[int, str]:
    """`PORT=/path/to/socket`."""
    port, sep, path = spec.partition("=")
    if not sep or not port.isdigit() or not path:
        raise argparse.ArgumentTypeError(f"expected PORT=/path/to/socket, got {spec!r}")
    return int(port), path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m polar.sandbox.bridge", description=__doc__)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--forward", action="append", type=parse_forward, default=[], help="PORT=/path/to/socket")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- the command to run")
    args = p.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        p.error("no command given")
    for port, path in args.forward:
        tcp_to_unix(args.host, port, path)
    try:
        proc = subprocess.Popen(command)
    except OSError as e:
        print(f"polar bridge: cannot start {command[0]}: {e}", file=sys.stderr)
        return 127
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda n, _f: proc.send_signal(n))
    rc = proc.wait()
    return 128 - rc if rc < 0 else rc


if __name__ == "__main__":
    sys.exit(main())
