"""The verifier's way out (issue 66 item 2): an HTTP proxy that lets a task's verify stage reach only the hosts
the operator allows, and logs every connection it was asked for.

A task that asks for the internet (a Harbor task's `allow_internet`: terminal-bench's test.sh installs curl with
apt, uv with its installer, then pytest with uvx) gets it in its verify stage only, and only through this proxy.
The verify sandbox stays `--network none`; the proxy listens on a unix socket file in the sandbox's shared folder
and the in-sandbox forwarder (polar/sandbox/bridge.py) makes it 127.0.0.1:PORT inside, named by http_proxy and
https_proxy. The agent's stage never gets it, and the verify sandbox starts fresh from the task's ground, so
nothing the agent left is running there.

- `CONNECT host:port` (HTTPS, any TLS client): tunnelled when the host is allowed, else 403.
- `GET http://host/path` (plain HTTP: apt's mirrors): forwarded when allowed, one request per connection.
Only ports 80 and 443; a listed name that resolves to a loopback or private address is refused (only an
operator's `host=target:port` reaches one). Each request is one JSON line in the log: host, port, method,
allowed, and why not.

The list (`--verifier-hosts`, POLAR_VERIFIER_HOSTS): host names, `*.domain` for any name under a domain, and
`host=target:port` to send a host elsewhere (a local mirror; the tests' stand-ins on 127.0.0.1).
"""
from __future__ import annotations

import fnmatch
import ipaddress
import json
import os
import re
import socket
import socketserver
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator, Mapping, Sequence

from polar.sandbox.bridge import unix_at_length
from polar.sandbox.runtime import ExecResult, Sandbox

# What terminal-bench 2 verifiers fetch: Debian's and Ubuntu's package mirrors (apt-get install curl), PyPI and
# its file host (pip, uvx pytest), the uv installer's host and the GitHub release downloads it redirects to.
DEFAULT_HOSTS = ("deb.debian.org", "security.debian.org", "archive.ubuntu.com", "security.ubuntu.com",
                 "ports.ubuntu.com", "pypi.org", "files.pythonhosted.org", "astral.sh", "github.com",
                 "objects.githubusercontent.com", "release-assets.githubusercontent.com")
PORTS = (80, 443)
HOSTS_ENV = "POLAR_VERIFIER_HOSTS"
MAX_CONNECTIONS = 64
HEAD_BYTES = 65536  # a request line and headers larger than this are refused
CONNECT_TIMEOUT_S = 15.0
IDLE_TIMEOUT_S = 300.0  # a tunnel quiet this long is closed
BUFFER = 65536
HOST_NAME = re.compile(r"^(\*\.)?([a-z0-9-]+\.)*[a-z0-9-]+$")  # a name, or *.domain


class EgressError(ValueError):
    pass


@dataclass(frozen=True)
class Allowlist:
    """Hosts a verifier may reach (exact names or `*.domain` globs, lower case) and where some of them go."""

    patterns: tuple[str, ...]
    targets: dict[str, tuple[str, int]] = field(default_factory=dict)  # host -> (target host, port)

    def allows(self, host: str) -> bool:
        return any(fnmatch.fnmatchcase(_name(host), p) for p in self.patterns)

    def mapped(self, host: str) -> tuple[str, int] | None:
        """Where an operator's `host=target:port` sends `host` (None: nowhere but itself)."""
        return self.targets.get(_name(host))

    def target(self, host: str, port: int) -> tuple[str, int]:
        return self.mapped(host) or (host, port)

    def entries(self) -> tuple[str, ...]:
        """The list again as parse_hosts reads it (a sample's state keeps it)."""
        return tuple(f"{p}={self.targets[p][0]}:{self.targets[p][1]}" if p in self.targets else p
                     for p in self.patterns)


def _name(host: str) -> str:
    """A host name as the list compares it: lower case, no trailing dot."""
    return host.lower().rstrip(".")


def parse_hosts(entries: Iterable[str]) -> Allowlist:
    """`host`, `*.domain` or `host=target:port` entries (commas or whitespace also split one string);
    EgressError naming the entry that is none of these."""
    patterns, targets = [], {}
    for entry in (e for item in entries for e in item.replace(",", " ").split()):
        name, sep, target = entry.partition("=")
        name = _name(name)
        if not HOST_NAME.match(name):
            raise EgressError(f"verifier hosts: {entry!r} is not a host name, *.domain or host=target:port")
        if sep:
            where, _, port = target.rpartition(":")
            if not where or not port.isdigit() or "*" in name:
                raise EgressError(f"verifier hosts: {entry!r}: expected host=target:port")
            targets[name] = (where, int(port))
        patterns.append(name)
    return Allowlist(tuple(patterns), targets)


def default_allowlist(env: Mapping[str, str] | None = None) -> Allowlist:
    """POLAR_VERIFIER_HOSTS of `env` (default: ours) when set, else DEFAULT_HOSTS."""
    given = (os.environ if env is None else env).get(HOSTS_ENV, "").strip()
    return parse_hosts([given] if given else DEFAULT_HOSTS)


class EgressProxy:
    """The proxy on a unix socket file, serving on its own threads until `close`; `log` gets a line a request."""

    def __init__(self, path: Path, allow: Allowlist, log: Path) -> None:
        self.allow, self.log = allow, log
        self.slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self._log_lock = threading.Lock()
        path.unlink(missing_ok=True)
        proxy = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                if not proxy.slots.acquire(blocking=False):
                    return  # refused at once, never queued
                try:
                    proxy.serve(self.request)
                finally:
                    proxy.slots.release()

        self.server = socketserver.ThreadingUnixStreamServer(str(path), Handler, bind_and_activate=False)
        self.server.daemon_threads = True
        try:  # a batch's verify folder can pass AF_UNIX's 108 bytes: bound through the folder's descriptor
            unix_at_length(self.server.socket.bind, str(path))
            self.server.server_activate()
        except OSError:
            self.server.server_close()
            raise
        os.chmod(path, 0o666)  # the sandbox's user is another host uid
        self.path = path
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.path.unlink(missing_ok=True)

    def __enter__(self) -> EgressProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def serve(self, client: socket.socket) -> None:
        client.settimeout(IDLE_TIMEOUT_S)
        head = _read_head(client)
        if head is None:
            return
        method, host, port, request = _parse(head)
        why = ("not an HTTP proxy request" if host is None else
               f"port {port} (only {', '.join(map(str, PORTS))})" if port not in PORTS else
               "not on the verifier's host list" if not self.allow.allows(host) else "")
        self._record(method, host, port, why)
        if why:
            client.sendall(b"HTTP/1.1 403 Forbidden\r\nContent-Type: text/plain\r\nConnection: close\r\n\r\n"
                           + f"polar: the verifier may not reach {host}:{port}: {why}\n".encode())
            return
        try:
            upstream = self._connect(host, port)
        except OSError as e:
            self._record(method, host, port, f"connect failed: {e}")
            client.sendall(b"HTTP/1.1 502 Bad Gateway\r\nConnection: close\r\n\r\n")
            return
        with upstream:
            upstream.settimeout(IDLE_TIMEOUT_S)
            if method == "CONNECT":
                client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
            if request:
                upstream.sendall(request)
            _splice(client, upstream)

    def _connect(self, host: str, port: int) -> socket.socket:
        """A connection to the host (or where the list sends it). A listed name that resolves to this node or a
        private network is refused: a name is no way to the node's own services (its Redis, its engine); only an
        operator's `host=target:port` goes there."""
        if (to := self.allow.mapped(host)) is not None:
            return socket.create_connection(to, CONNECT_TIMEOUT_S)
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        inside = [info[4][0] for info in infos if not ipaddress.ip_address(info[4][0].split("%")[0]).is_global]
        if inside:
            raise OSError(f"{host} resolves to {inside[0]}, not a public address")
        family, kind, proto, _name, address = infos[0]
        sock = socket.socket(family, kind, proto)
        try:
            sock.settimeout(CONNECT_TIMEOUT_S)
            sock.connect(address)  # the address checked, not a second lookup
        except OSError:
            sock.close()
            raise
        return sock

    def _record(self, method: str, host: str | None, port: int, why: str) -> None:
        line = {"t": round(time.time(), 3), "method": method, "host": host, "port": port, "allowed": not why}
        if why:
            line["why"] = why
        with self._log_lock, open(self.log, "a") as f:
            f.write(json.dumps(line) + "\n")


def _read_head(client: socket.socket) -> bytes | None:
    data = b""
    while b"\r\n\r\n" not in data:
        try:
            chunk = client.recv(BUFFER)
        except OSError:
            return None
        if not chunk or len(data) + len(chunk) > HEAD_BYTES:
            return None
        data += chunk
    return data


def _parse(head: bytes) -> tuple[str, str | None, int, bytes]:
    """(method, host, port, the bytes to send upstream) of a proxy request; host None when it is not one. A
    plain-HTTP request is rewritten to origin form with `Connection: close` and no Proxy-* headers; after a
    CONNECT, what the client sent past its head (a TLS hello) goes up the tunnel."""
    end = head.index(b"\r\n\r\n")
    lines, past = head[:end].split(b"\r\n"), head[end + 4:]
    parts = lines[0].decode("latin-1").split(" ")
    if len(parts) != 3:
        return "?", None, 0, b""
    method, target, version = parts
    if method == "CONNECT":
        host, _, port = target.rpartition(":")
        return method, host.strip("[]") or None, int(port) if port.isdigit() else 0, past
    if not target.lower().startswith("http://"):
        return method, None, 0, b""
    authority, slash, path = target[7:].partition("/")
    host, _, port = authority.rpartition(":") if ":" in authority else (authority, "", "80")
    kept = [h for h in lines[1:] if h and not h.lower().startswith((b"proxy-", b"connection:"))]
    request = "\r\n".join([f"{method} {slash}{path} {version}", *(h.decode("latin-1") for h in kept),
                           "Connection: close", "", ""]).encode("latin-1") + past
    return method, host or None, int(port) if port.isdigit() else 0, request


def _splice(a: socket.socket, b: socket.socket) -> None:
    """Bytes both ways until both sides are done (a half-close passed on)."""
    def pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while chunk := src.recv(BUFFER):
                dst.sendall(chunk)
        except OSError:
            pass
        try:
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    other = threading.Thread(target=pump, args=(b, a), daemon=True)
    other.start()
    pump(a, b)
    other.join(IDLE_TIMEOUT_S)


INSIDE_PORT = 3128  # where the verifier sees the proxy: http://127.0.0.1:3128
SOCKET = "egress.sock"
NO_PROXY = "localhost,127.0.0.1,::1"


class WithEgress:
    """A verify sandbox whose every exec reaches the egress proxy at 127.0.0.1:INSIDE_PORT, named by the proxy
    variables curl, apt, pip and uv read."""

    def __init__(self, sandbox: Sandbox, socket_path: Path) -> None:
        self.sandbox, self.socket_path = sandbox, socket_path

    @property
    def name(self) -> str | None:
        return self.sandbox.name

    def exec(self, argv: Sequence[str], env: Mapping[str, str], cwd: Path, timeout_s: float, stdout: Path,
             stderr: Path, forwards: Sequence[tuple[int, Path]] = ()) -> ExecResult:
        url = f"http://127.0.0.1:{INSIDE_PORT}"
        proxy_env = {k: url for k in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY")}
        proxy_env.update(no_proxy=NO_PROXY, NO_PROXY=NO_PROXY)
        return self.sandbox.exec(argv, {**env, **proxy_env}, cwd, timeout_s, stdout, stderr,
                                 (*forwards, (INSIDE_PORT, self.socket_path)))

    def copy_in(self, src: Path, dst: Path) -> None:
        self.sandbox.copy_in(src, dst)

    def copy_out(self, src: Path, dst: Path) -> None:
        self.sandbox.copy_out(src, dst)

    def stop(self) -> None:
        self.sandbox.stop()


@contextmanager
def verifier_egress(sandbox: Sandbox, hosts: Sequence[str] | None, shared: Path, log: Path) -> Iterator[Sandbox]:
    """`sandbox` as it is when `hosts` is None (offline), else behind an egress proxy allowing `hosts` for as
    long as the block runs, each request a line of `log`."""
    if hosts is None:
        yield sandbox
        return
    with EgressProxy(shared / SOCKET, parse_hosts(hosts), log):
        yield WithEgress(sandbox, shared / SOCKET)
