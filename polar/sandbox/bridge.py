"""Reach the proxy from a network namespace with nothing but loopback (docs/design.md §6).

A unix socket on the filesystem crosses network namespaces; TCP does not. Outside, `UnixToTcp` listens on a
socket file and connects each client to the proxy's TCP port. Inside, `python -m polar.sandbox.bridge` listens on
127.0.0.1:PORT (the same port numbers, so URLs read the same), connects each client to the socket file, and
runs the harness command once its listeners are up; it exits with the harness's status.

Each forwarder serves all its connections on one selector in one thread, at most `limit` at once: the agent
opening thousands of connections costs the worker no thread and no more than `limit` upstream connections; one
beyond the limit is accepted and closed at once (refused, never queued). Stdlib only: the sandbox's python3 runs
this file as a script, once per harness run, so it imports little (issue 47: no subprocess, pathlib or typing,
run with -S: 15 ms of CPU to start against 27).
"""
from __future__ import annotations

import os
import selectors
import signal
import socket
import sys
import threading
from collections.abc import Callable  # selectors imports it already

BUFFER = 65536
BACKLOG = 128
# Concurrent connections per forwarder (one per sandbox and proxy listener). A harness uses a handful; the cap
# keeps a runaway agent from holding the proxy's or the worker's sockets for its siblings.
MAX_CONNECTIONS = 64
CONNECT_TIMEOUT_S = 10.0
UNIX_PATH_MAX = 107  # bytes of a socket file's path, its terminating NUL aside
READ, WRITE = selectors.EVENT_READ, selectors.EVENT_WRITE


class _Link:
    """One spliced connection: bytes both ways, a half-close passed on once what was read before it is written,
    no more than BUFFER bytes held per direction (a side is not read while the other has not taken its bytes)."""

    def __init__(self, forwarder: Forwarder, a: socket.socket, b: socket.socket) -> None:
        self.forwarder, self.socks = forwarder, (a, b)
        self.pending = {a: b"", b: b""}  # bytes waiting to be written to this socket
        self.ended = {a: False, b: False}  # this socket said EOF
        self.shut = {a: False, b: False}  # its EOF was passed on: writing to this socket is shut
        self.masks = {a: 0, b: 0}
        for sock in self.socks:
            sock.setblocking(False)
        self._watch()

    def other(self, sock: socket.socket) -> socket.socket:
        return self.socks[1] if sock is self.socks[0] else self.socks[0]

    def on_event(self, sock: socket.socket, mask: int) -> None:
        try:
            if mask & WRITE:
                self._flush(sock)
            if mask & READ:
                data = sock.recv(BUFFER)
                if data:
                    self.pending[self.other(sock)] += data
                else:
                    self.ended[sock] = True
                self._flush(self.other(sock))
        except (BlockingIOError, InterruptedError):
            pass
        except OSError:  # one side reset: end both
            return self.close()
        if all(self.shut.values()):
            return self.close()
        self._watch()

    def _flush(self, dst: socket.socket) -> None:
        if self.pending[dst]:
            sent = dst.send(self.pending[dst])
            self.pending[dst] = self.pending[dst][sent:]
        if not self.pending[dst] and self.ended[self.other(dst)] and not self.shut[dst]:
            self.shut[dst] = True
            dst.shutdown(socket.SHUT_WR)  # half-close: the other direction may still be answering

    def _watch(self) -> None:
        sel = self.forwarder.selector
        for sock in self.socks:
            mask = (READ if not self.ended[sock] and not self.pending[self.other(sock)] else 0) | (
                WRITE if self.pending[sock] else 0)
            if mask != self.masks[sock]:
                if not self.masks[sock]:
                    sel.register(sock, mask, self.on_event)
                elif mask:
                    sel.modify(sock, mask, self.on_event)
                else:
                    sel.unregister(sock)
                self.masks[sock] = mask

    def close(self) -> None:
        for sock in self.socks:
            if self.masks[sock]:
                self.forwarder.selector.unregister(sock)
                self.masks[sock] = 0
            sock.close()
        if self in self.forwarder.links:
            self.forwarder.links.discard(self)
            self.forwarder.active -= 1


class Forwarder:
    """Accepts on `listener`, splices every client to a fresh `connect()`, at most `limit` at once, all on one
    thread with one selector. No asyncio: inside the sandbox its import was most of this script's start-up cost,
    paid once per harness run."""

    def __init__(self, listener: socket.socket, connect: Callable[[], socket.socket],
                 limit: int = MAX_CONNECTIONS) -> None:
        self.listener, self.connect, self.limit = listener, connect, limit
        self.active = self.refused = 0
        self.links: set[_Link] = set()
        self.selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._stopping = False
        listener.setblocking(False)
        self.selector.register(listener, READ, self._accept)
        self.selector.register(self._wake_r, READ, None)
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self._stopping:
            for key, mask in self.selector.select():
                if key.data is not None:
                    key.data(key.fileobj, mask)
        for link in list(self.links):
            link.close()
        self.selector.close()
        self._wake_r.close()

    def _accept(self, listener: socket.socket, _mask: int) -> None:
        try:
            client, _ = listener.accept()
        except OSError:
            return
        if self.active >= self.limit:
            self.refused += 1
            client.close()  # refused at once, never queued
            return
        try:
            upstream = self.connect()
        except OSError:
            client.close()
            return
        self.active += 1
        self.links.add(_Link(self, client, upstream))

    def close(self) -> None:
        """Stop accepting and end every open connection."""
        self._stopping = True
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass
        self.thread.join(10)
        self._wake_w.close()
        self.listener.close()


def _unix_connected(path: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(CONNECT_TIMEOUT_S)
    try:
        if len(path.encode()) <= UNIX_PATH_MAX:
            sock.connect(path)
        else:
            unix_at_length(sock.connect, path)
    except OSError:
        sock.close()
        raise
    return sock


def unix_at_length(op: Callable[[str], None], path: str) -> None:
    """bind or connect a socket file whose path passes AF_UNIX's 108 bytes (a batch's sample folder can): through a
    descriptor of its folder, /proc/self/fd/N/NAME."""
    folder, name = os.path.split(path)
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        op(f"/proc/self/fd/{fd}/{name}")
    finally:
        os.close(fd)


class UnixToTcp(Forwarder):
    """Outside the sandbox: socket file -> host:port."""

    def __init__(self, path: os.PathLike[str], host: str, port: int, limit: int = MAX_CONNECTIONS) -> None:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(path))
        os.chmod(path, 0o666)  # a rootless sandbox user may map to another uid
        listener.listen(BACKLOG)
        self.path = path
        super().__init__(listener, lambda: socket.create_connection((host, port), CONNECT_TIMEOUT_S), limit)


def tcp_to_unix(host: str, port: int, path: str, limit: int = MAX_CONNECTIONS) -> Forwarder:
    """Inside the sandbox: host:port -> socket file."""
    return to_unix(socket.create_server((host, port), backlog=BACKLOG), path, limit)


def to_unix(listener: socket.socket, path: str, limit: int = MAX_CONNECTIONS) -> Forwarder:
    """A listening socket (one the node opened in the sandbox's network namespace: netns.py) -> socket file."""
    return Forwarder(listener, lambda: _unix_connected(path), limit)


def parse_forward(spec: str) -> tuple[int, str]:
    """`PORT=/path/to/socket`."""
    port, sep, path = spec.partition("=")
    if not sep or not port.isdigit() or not path:
        raise ValueError(f"expected PORT=/path/to/socket, got {spec!r}")
    return int(port), path


USAGE = "usage: bridge.py [--host HOST] [--forward PORT=/path/to/socket ...] -- COMMAND ..."


def parse_args(argv: list[str]) -> tuple[str, list[tuple[int, str]], list[str]]:
    """(host, forwards, command); ValueError for anything else (no argparse: its import is start-up time)."""
    host, forwards, rest = "127.0.0.1", [], list(argv)
    while rest and rest[0] != "--":
        flag = rest.pop(0)
        if flag not in ("--host", "--forward") or not rest:
            raise ValueError(f"unexpected {flag!r}")
        value = rest.pop(0)
        if flag == "--host":
            host = value
        else:
            forwards.append(parse_forward(value))
    command = rest[1:]
    if not command:
        raise ValueError("no command given")
    return host, forwards, command


def _not_inherited() -> None:
    """What we were handed beyond stdio is not the command's (as Popen's close_fds was)."""
    try:
        fds = [int(n) for n in os.listdir("/proc/self/fd")]
    except OSError:
        return
    for fd in fds:
        if fd > 2:
            try:
                os.set_inheritable(fd, False)
            except OSError:
                pass  # the listing's own descriptor, closed by now


def main(argv: list[str] | None = None) -> int:
    try:
        host, forwards, command = parse_args(sys.argv[1:] if argv is None else argv)
    except ValueError as e:
        print(f"{USAGE}\npolar bridge: {e}", file=sys.stderr)
        return 2
    # A SIGTERM that comes before the handlers below exist would kill us and orphan the command: they wait, blocked,
    # until the handlers are in place. Blocked before the forwards start their thread, which inherits the mask (a
    # thread that does not block them would take the signal's default action); the command starts unblocked.
    passed_on = {signal.SIGTERM, signal.SIGINT}
    signal.pthread_sigmask(signal.SIG_BLOCK, passed_on)
    _not_inherited()
    for port, path in forwards:
        tcp_to_unix(host, port, path)
    try:
        pid = os.posix_spawnp(command[0], command, os.environ, setsigmask=())
    except OSError as e:
        print(f"polar bridge: cannot start {command[0]}: {e}", file=sys.stderr)
        return 127
    for sig in passed_on:
        signal.signal(sig, lambda n, _f: os.kill(pid, n))
    signal.pthread_sigmask(signal.SIG_UNBLOCK, passed_on)
    rc = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    return 128 - rc if rc < 0 else rc


if __name__ == "__main__":
    sys.exit(main())
