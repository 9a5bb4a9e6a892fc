"""Which callback URLs `polar api` POSTs to (docs/api.md, "Callback policy").

A callback URL is a request the service makes on a submitter's behalf, from inside the cluster: without a policy
a token holder could aim it at a cloud metadata address or an internal service. The URL's host must be on the
allowlist: `localhost`, 127.0.0.0/8 and ::1 by default, plus the hosts the operator names (`polar api
--callback-host HOST`, `$POLAR_CALLBACK_HOSTS`): a name (matched exactly), an address or a CIDR network. Every
address the host resolves to must then be public, or inside an address or network the allowlist names: link-local
(169.254/16, fe80::/10, the metadata addresses among them), private, shared, unspecified, multicast and reserved
addresses are refused unless named. The host is resolved once per delivery and the connection goes to that
address (a name that resolves elsewhere a moment later, DNS rebinding, changes nothing).
"""
from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass
from typing import Callable, Iterable
from urllib.parse import urlsplit

HOSTS_ENV = "POLAR_CALLBACK_HOSTS"
DEFAULT_HOSTS = ("localhost", "127.0.0.0/8", "::1")
Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Resolver = Callable[[str, int], list[str]]


class CallbackRefused(ValueError):
    """A callback URL the policy refuses; the message is one line (the 422 names `callback_url`)."""


@dataclass(frozen=True)
class Target:
    """Where one delivery goes: the URL as given and the one address it connects to."""

    url: str
    scheme: str
    host: str
    port: int
    address: str


def resolve(host: str, port: int) -> list[str]:
    return sorted({info[4][0] for info in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)})


def _address(text: str) -> Address | None:
    try:
        ip = ipaddress.ip_address(text.split("%", 1)[0])
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped  # ::ffff:169.254.169.254 is 169.254.169.254
    return ip


def parse_hosts(entries: Iterable[str]) -> tuple[frozenset[str], tuple[Network, ...]]:
    """Names and networks from allowlist entries (commas or spaces between them); ValueError names a bad one."""
    names: set[str] = set()
    networks: list[Network] = []
    for entry in (e for raw in entries for e in raw.replace(",", " ").split()):
        if _address(entry) is not None or "/" in entry:
            try:
                networks.append(ipaddress.ip_network(entry, strict=False))
            except ValueError as e:
                raise ValueError(f"callback host {entry!r}: not an address or network ({e})") from e
        elif entry.strip(".").replace("-", "").replace(".", "").isalnum():
            names.add(entry.lower().rstrip("."))
        else:
            raise ValueError(f"callback host {entry!r}: not a host name, address or network")
    return frozenset(names), tuple(networks)


@dataclass(frozen=True)
class CallbackPolicy:
    names: frozenset[str]
    networks: tuple[Network, ...]

    @classmethod
    def of(cls, extra: Iterable[str] = ()) -> "CallbackPolicy":
        return cls(*parse_hosts([*DEFAULT_HOSTS, *extra]))

    def named(self, ip: Address) -> bool:
        return any(ip.version == n.version and ip in n for n in self.networks)

    def check(self, url: str, resolver: Resolver = resolve) -> Target:
        """The address to deliver `url` to, or CallbackRefused saying why not."""
        try:
            parts = urlsplit(url)
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError as e:
            raise CallbackRefused(f"{url!r} is not a URL ({e})") from e
        host = (parts.hostname or "").rstrip(".")
        if parts.scheme not in ("http", "https") or not host:
            raise CallbackRefused(f"{url!r}: expected http(s)://HOST[:PORT]/PATH")
        literal = _address(host)
        if literal is not None and not self.named(literal):
            raise CallbackRefused(f"address {host} is not an allowed callback host (polar api --callback-host)")
        if literal is None and host not in self.names:
            raise CallbackRefused(f"host {host!r} is not on the callback allowlist (polar api --callback-host)")
        try:
            found = [literal] if literal is not None else [_address(a) for a in resolver(host, port)]
        except OSError as e:
            raise CallbackRefused(f"host {host!r} does not resolve ({e})") from e
        if not found or None in found:
            raise CallbackRefused(f"host {host!r} resolves to no usable address")
        for ip in found:
            if not (self.named(ip) or ip.is_global):
                raise CallbackRefused(f"host {host!r} resolves to {ip}, a link-local, private or reserved address "
                                      f"(name the address or its network with --callback-host to allow it)")
        return Target(url, parts.scheme, host, port, str(found[0]))


def redact(url: str) -> str:
    """A URL fit for a log line: no user info, no query (either may carry a trainer's secret)."""
    try:
        parts = urlsplit(url)
        netloc = parts.netloc.rsplit("@", 1)[-1]
    except ValueError:
        return "<unparsable URL>"
    return f"{parts.scheme}://{netloc}{parts.path}" + ("?…" if parts.query else "")
