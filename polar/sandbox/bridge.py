"""Reach the proxy from a network namespace with nothing but loopback (DESIGN.md §6).

A unix socket on the filesystem crosses network namespaces; TCP does not. Outside, `UnixToTcp` listens on a
socket file and connects each client to the proxy's TCP port. Inside, `python -m polar.sandbox.bridge` listens on
127.0.0.1:PORT (the same port numbers, so URLs read the same), connects each client to the socket file, and
runs the harness command once its listeners are up; it exits with the harness's status.

Each forwarder serves all its connections on one asyncio loop in one thread, at most `limit` at once: the agent
opening thousands of connections costs the worker no thread and no more than `limit` upstream connections; one
beyond the limit is accepted and closed at once (refused, never queued). Stdlib only: the sandbox's python3 runs
this file as a script.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Awaitable, Callable

BUFFER = 65536
BACKLOG = 128
# Concurrent connections per forwarder (one per sandbox and proxy listener). A harness uses a handful; the cap
# keeps a runaway agent from holding the proxy's or the worker's sockets for its siblings.
MAX_CONNECTIONS = 64
Streams = tuple[asyncio.StreamReader, asyncio.StreamWriter]


async def _pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
    while data := await src.read(BUFFER):
        dst.write(data)
        await dst.drain()
    if dst.can_write_eof():
        dst.write_eof()  # half-close: the other direction may still be answering


class _Forwarder:
    """Accepts on `listener`, splices every client to a fresh `connect()`, at most `limit` at once."""

    def __init__(self, listener: socket.socket, connect: Callable[[], Awaitable[Streams]],
                 limit: int = MAX_CONNECTIONS) -> None:
        self.listener, self.connect, self.limit = listener, connect, limit
        self.active = self.refused = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._stop = asyncio.Event()  # bound to the loop on first use, in the loop's thread
        self._loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self._loop.run_until_complete, args=(self._serve(),), daemon=True)
        self.thread.start()

    async def _serve(self) -> None:
        if self.listener.family == socket.AF_UNIX:
            server = await asyncio.start_unix_server(self._client, sock=self.listener, backlog=BACKLOG)
        else:
            server = await asyncio.start_server(self._client, sock=self.listener, backlog=BACKLOG)
        await self._stop.wait()
        server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await asyncio.sleep(0)  # the transports' sockets close on the next turn

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.active >= self.limit:
            self.refused += 1
            writer.transport.abort()
            return
        self.active += 1
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            await self._splice(reader, writer)
        finally:
            self.active -= 1
            self._tasks.discard(task)

    async def _splice(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await self.connect()
        except OSError:
            writer.transport.abort()
            return
        pipes = [asyncio.ensure_future(_pipe(reader, up_writer)), asyncio.ensure_future(_pipe(up_reader, writer))]
        try:
            await asyncio.gather(*pipes)
        except OSError:
            pass  # one side reset: end both
        finally:
            for p in pipes:
                p.cancel()
            await asyncio.gather(*pipes, return_exceptions=True)
            writer.close()  # after what is still buffered
            up_writer.close()

    def close(self) -> None:
        """Stop accepting and end every open connection."""
        try:
            self._loop.call_soon_threadsafe(self._stop.set)
        except RuntimeError:
            pass  # the loop already ended
        self.thread.join(10)
        if not self.thread.is_alive():
            self._loop.close()
        self.listener.close()


class UnixToTcp(_Forwarder):
    """Outside the sandbox: socket file -> host:port."""

    def __init__(self, path: Path, host: str, port: int, limit: int = MAX_CONNECTIONS) -> None:
        path.unlink(missing_ok=True)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(path))
        os.chmod(path, 0o666)  # a rootless sandbox user may map to another uid
        listener.listen(BACKLOG)
        self.path = path
        super().__init__(listener, lambda: asyncio.open_connection(host, port), limit)


def tcp_to_unix(host: str, port: int, path: str, limit: int = MAX_CONNECTIONS) -> _Forwarder:
    """Inside the sandbox: host:port -> socket file."""
    listener = socket.create_server((host, port), backlog=BACKLOG)
    return _Forwarder(listener, lambda: asyncio.open_unix_connection(path), limit)


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
