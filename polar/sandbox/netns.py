"""A loopback-only network namespace made by the node, the proxy's ports listening inside it (issue 47).

bwrap's `--unshare-net` gives a sandbox a network namespace holding only loopback, and the in-sandbox forwarder
(bridge.py) then listens there on the proxy's ports: a python start per harness run, ~25 ms of CPU. A node
running as root makes that namespace itself instead: a short-lived thread unshares its network namespace, brings
loopback up, opens the listeners on 127.0.0.1 and ends; the namespace lives on in the listeners and one
descriptor. The sandbox is started in it (`nsenter --net`, then bwrap without `--unshare-net`), and the node
serves the listeners on its own threads, each connection spliced to the proxy's socket file as the in-sandbox
forwarder did. The sandbox sees the same: loopback only, the proxy's ports on 127.0.0.1, nothing else.
"""
from __future__ import annotations

import ctypes
import fcntl
import functools
import os
import shutil
import socket
import struct
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from polar.sandbox import bridge

CLONE_NEWNET = 0x40000000
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1  # <linux/sockios.h>, <net/if.h>
_libc = ctypes.CDLL(None, use_errno=True)


@functools.cache
def nsenter() -> str | None:
    """The `nsenter` that starts a sandbox in a namespace of ours, when this process may make one (root). Looked
    up once per process: each harness exec asks."""
    if os.geteuid() != 0:
        return None
    return shutil.which("nsenter", path=os.environ.get("PATH", "") + ":/usr/bin:/bin")


@dataclass
class LoopbackNet:
    """The namespace: `path` for `nsenter --net=`; closing it stops the listeners and lets it go."""

    fd: int
    forwarders: list[bridge.Forwarder] = field(default_factory=list)

    @property
    def path(self) -> str:
        return f"/proc/{os.getpid()}/fd/{self.fd}"

    def close(self) -> None:
        for forwarder in self.forwarders:
            forwarder.close()
        os.close(self.fd)


def loopback_net(forwards: Sequence[tuple[int, Path]]) -> LoopbackNet:
    """A new namespace with loopback up and, for each (port, socket file), 127.0.0.1:port listening inside and
    spliced to the socket file. OSError when it cannot be made."""
    listeners: list[socket.socket] = []
    fds: list[int] = []
    errors: list[OSError] = []

    def inside() -> None:  # namespaces are per thread: this one's goes on in the sockets it opens
        try:
            if _libc.unshare(CLONE_NEWNET):
                err = ctypes.get_errno()
                raise OSError(err, f"unshare(CLONE_NEWNET): {os.strerror(err)}")
            _loopback_up()
            for port, _path in forwards:
                listeners.append(socket.create_server(("127.0.0.1", port), backlog=bridge.BACKLOG))
            fds.append(os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC))
        except OSError as e:
            errors.append(e)

    thread = threading.Thread(target=inside, name="polar-netns")
    thread.start()
    thread.join()
    if errors:
        for listener in listeners:
            listener.close()
        raise errors[0]
    return LoopbackNet(fds[0], [bridge.to_unix(listener, str(path)) for listener, (_port, path)
                                in zip(listeners, forwards)])


def own_net(forwards: Sequence[tuple[int, Path]]) -> LoopbackNet | None:
    """loopback_net, or None where this host refuses it (a container without CAP_SYS_ADMIN, say): the caller
    falls back to the in-sandbox forwarder, as isolated. Asked once per process."""
    global _refused
    if _refused:
        return None
    try:
        return loopback_net(forwards)
    except OSError as e:
        _refused = True
        print(f"polar: cannot make a sandbox's network namespace here ({e}); bwrap makes it and the in-sandbox "
              "forwarder listens there", file=sys.stderr, flush=True)
        return None


_refused = False


def _loopback_up() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        request = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(s.fileno(), SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(s.fileno(), SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags | IFF_UP))
