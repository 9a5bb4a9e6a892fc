"""Refusal: only LLM API calls to known provider hosts pass; everything else is answered 403 here,
before any upstream connection (docs/design.md §2, §8)."""
from __future__ import annotations

import ipaddress
import logging
import re

from mitmproxy import ctx, http
from mitmproxy.exceptions import OptionsError
from mitmproxy.proxy.mode_specs import ReverseMode

from polar_mitm.providers.responses import error_response, family_api
from polar_mitm.providers.routes import PROVIDER_HOSTS, family_of, match_route

_LABEL = r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?"
# A public DNS name: at least two labels, the last one alphabetic (so never an IP literal).
_HOSTNAME = re.compile(rf"({_LABEL}\.)+[a-z]([a-z0-9-]{{0,61}}[a-z0-9])?")
TLS_PORT = 443
log = logging.getLogger(__name__)


def parse_hosts(spec: str) -> frozenset[str]:
    """Comma-separated extra hostnames to intercept, e.g. a self-hosted OpenAI-compatible name. Only real DNS
    names: no IP literals, no `localhost`, no single-label names (a CONNECT must never name a local service)."""
    hosts = [h.strip().lower() for h in spec.split(",") if h.strip()]
    for h in hosts:
        if _is_ip(h) or not _HOSTNAME.fullmatch(h) or h == "localhost" or h.endswith(".localhost"):
            raise ValueError(f"not a public hostname: {h!r} (IP literals, localhost and single-label names are refused)")
    return frozenset(PROVIDER_HOSTS) | frozenset(hosts)


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text.strip("[]"))
        return True
    except ValueError:
        return False


def parse_size(spec: int) -> int:
    if spec <= 0:
        raise ValueError(f"expected a positive number of bytes, got {spec}")
    return spec


def is_base_url_mode(flow: http.HTTPFlow) -> bool:
    return isinstance(flow.client_conn.proxy_mode, ReverseMode)


def request_headers(flow: http.HTTPFlow) -> dict[str, str]:
    """The request's headers by lower-cased name, a repeated one's values joined with ", " (what
    `{k.lower(): v for k, v in headers.items()}` gives), read from the raw fields once per flow: mitmproxy's
    Headers.items() looks every name up again through all fields."""
    cached = flow.metadata.get("polar_headers")
    if cached is None:
        cached = {}
        for key, value in flow.request.headers.fields:
            name, text = key.decode("utf-8", "surrogateescape").lower(), value.decode("utf-8", "surrogateescape")
            cached[name] = f"{cached[name]}, {text}" if name in cached else text
        flow.metadata["polar_headers"] = cached
    return cached


class Guard:
    def __init__(self) -> None:
        self.hosts = frozenset(PROVIDER_HOSTS)
        self.max_body = 32 * 2**20

    def load(self, loader) -> None:
        loader.add_option("polar_hosts", str, "", "Extra hostnames (comma-separated) to serve as LLM providers.")
        loader.add_option("polar_max_body", int, 32 * 2**20,
                          "Largest request body in bytes, before and after content decoding (413 beyond).")

    def configure(self, updated) -> None:
        for name, parse, attr in (("polar_hosts", parse_hosts, "hosts"), ("polar_max_body", parse_size, "max_body")):
            if name in updated:
                try:
                    setattr(self, attr, parse(getattr(ctx.options, name)))
                except ValueError as e:
                    raise OptionsError(f"{name}: {e}") from e

    def http_connect(self, flow: http.HTTPFlow) -> None:
        if flow.response:
            return
        host, port = flow.request.host.lower(), flow.request.port
        if host not in self.hosts or port != TLS_PORT:
            log.info("polar: refused CONNECT %s:%d", host, port)
            flow.response = http.Response.make(
                403, f"polar: {host}:{port} is not an LLM provider this proxy serves (only port 443 of {len(self.hosts)} "
                     "known hosts)\n", {"content-type": "text/plain"},
            )
            return
        flow.metadata["polar_connect_ok"] = True

    def request(self, flow: http.HTTPFlow) -> None:
        if flow.response:
            return
        headers = request_headers(flow)
        family = family_of(flow.request.pretty_host.lower(), headers, flow.request.path)
        api = family_api(family)
        if not is_base_url_mode(flow) and flow.request.pretty_host.lower() not in self.hosts:
            log.info("polar: refused a request to %s (not a provider host)", flow.request.pretty_host)
            flow.response = error_response(api, 403, f"polar: {flow.request.pretty_host} is not served")
            return
        if headers.get("upgrade", "").lower() == "websocket":
            # codex tries a WebSocket first and falls back to plain POST when refused (docs/design.md §7).
            flow.response = error_response(api, 403, "polar: WebSocket transport is not served")
            return
        route = match_route(flow.request.method, flow.request.path, family)
        if route is None:
            log.info("polar: refused %s %s%s (not an LLM call)", flow.request.method, flow.request.pretty_host,
                     flow.request.path.split("?")[0])
            flow.response = error_response(
                api, 403, f"polar: {flow.request.method} {flow.request.path.split('?')[0]} is not served"
            )
            return
        too_big = self._body_too_big(flow)
        if too_big:
            flow.response = error_response(route.api, 413, too_big, "request_too_large")
            return
        flow.metadata["polar_route"] = route

    def _body_too_big(self, flow: http.HTTPFlow) -> str | None:
        """The encoded body and its decoded size are both capped: a small gzip/br/zstd body can expand a
        thousandfold. Decoding stops one chunk past the limit."""
        raw = flow.request.raw_content or b""
        if len(raw) > self.max_body:
            return f"polar: request body of {len(raw)} bytes exceeds the proxy's limit of {self.max_body}"
        encoding = flow.request.headers.get("content-encoding", "").strip().lower()
        if encoding in ("", "identity"):
            return None
        size = decoded_size(raw, encoding, self.max_body)
        if size is None:
            return f"polar: request body encoded as {encoding!r} cannot be decoded"
        if size > self.max_body:
            return f"polar: decoded request body exceeds the proxy's limit of {self.max_body} bytes"
        return None


def decoded_size(raw: bytes, encoding: str, limit: int) -> int | None:
    """Decoded length of `raw`, counting at most limit+1 bytes; None when it does not decode."""
    import zlib

    try:
        if encoding in ("gzip", "x-gzip", "deflate"):
            wbits = 31 if "gzip" in encoding else 15
            d = zlib.decompressobj(wbits)
            out = d.decompress(raw, limit + 1)
            return len(out)
        if encoding == "br":
            import brotli

            d = brotli.Decompressor()
            total = 0
            for i in range(0, len(raw), 4096):
                total += len(d.process(raw[i:i + 4096]))
                if total > limit:
                    return total
            return total
        if encoding == "zstd":
            import zstandard

            reader = zstandard.ZstdDecompressor().stream_reader(raw)
            return len(reader.read(limit + 1))
    except Exception:
        return None
    return None
