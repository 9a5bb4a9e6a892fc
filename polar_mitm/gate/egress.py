"""Egress: the connection-layer backstop. Whatever the HTTP-level code does, mitmproxy may open no upstream
connection except to Polar's own stream relay (which talks only to the inference engine), and no client
connection may become a raw TCP/UDP/DNS tunnel (docs/design.md §2: the proxy fails closed)."""
from __future__ import annotations

import logging

from mitmproxy import ctx
from mitmproxy.exceptions import OptionsError
from mitmproxy.proxy import commands, layer, layers
from mitmproxy.proxy.mode_specs import ProxyMode, RegularMode, ReverseMode

log = logging.getLogger(__name__)

# Options whose non-default values would let traffic skip the HTTP layer (and so every Polar check).
FORCED = {"connection_strategy": "lazy", "rawtcp": False, "stream_large_bodies": None}
MUST_BE_EMPTY = ("ignore_hosts", "allow_hosts", "tcp_hosts", "udp_hosts")
# Layers that forward bytes without HTTP semantics: never allowed.
TUNNEL_LAYERS = tuple(getattr(layers, n) for n in ("TCPLayer", "UDPLayer", "DNSLayer", "RawQuicLayer") if hasattr(layers, n))


def check_modes(specs: list[str]) -> None:
    """Only `regular` (HTTPS_PROXY) and `reverse` (base URL) listeners: socks5, transparent, wireguard and the
    like would reach the network without an HTTP CONNECT to check."""
    for spec in specs:
        mode = ProxyMode.parse(spec)
        if not isinstance(mode, (RegularMode, ReverseMode)):
            raise ValueError(f"proxy mode {spec!r} is not allowed (only regular@… and reverse:…@…)")


class _Refused(layer.Layer):
    """Closes the client connection instead of tunnelling it."""

    def _handle_event(self, event):
        yield commands.CloseConnection(self.context.client)


class Egress:
    def __init__(self) -> None:
        self.allowed: set[tuple[str, int]] = set()  # set by the relay once it listens

    def configure(self, updated) -> None:
        opts = ctx.options
        for name, value in FORCED.items():
            if getattr(opts, name) != value:
                opts.update(**{name: value})

    def check(self, opts) -> None:
        """Once running (raising from configure would make mitmproxy roll back and configure again, forever)."""
        for name in MUST_BE_EMPTY:
            if getattr(opts, name):
                raise OptionsError(f"{name}: must stay empty with Polar (it would bypass the proxy's checks)")
        for name, value in FORCED.items():
            if getattr(opts, name) != value:
                raise OptionsError(f"{name}: must be {value!r} with Polar")
        try:
            check_modes(list(opts.mode))
        except ValueError as e:
            raise OptionsError(f"mode: {e}") from e

    def next_layer(self, nextlayer: layer.NextLayer) -> None:
        if isinstance(nextlayer.layer, TUNNEL_LAYERS):
            log.warning("polar: refused a %s on %s (not HTTP)", type(nextlayer.layer).__name__,
                        nextlayer.context.server.address)
            nextlayer.layer = _Refused(nextlayer.context)

    def server_connect(self, data) -> None:
        try:
            address = data.server.address
            ok = address is not None and (address[0], address[1]) in self.allowed and data.server.via is None
        except Exception:  # fail closed even if this check itself breaks
            ok = False
        if not ok:
            log.error("polar: refused an upstream connection to %s: only the engine relay is allowed",
                      getattr(data.server, "address", None))
            data.server.error = "polar: upstream connection refused (only the inference engine is reachable)"
