"""Refusal: only LLM API calls to known provider hosts pass; everything else is answered 403 here,
before any upstream connection (DESIGN.md §2, §8)."""
from __future__ import annotations

import re

from mitmproxy import ctx, http
from mitmproxy.exceptions import OptionsError
from mitmproxy.proxy.mode_specs import ReverseMode

from polar_mitm.replies import error_response, family_api
from polar_mitm.routes import PROVIDER_HOSTS, family_of, match_route


_HOSTNAME = re.compile(r"[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)*")


def parse_hosts(spec: str) -> frozenset[str]:
    """Comma-separated extra hostnames to intercept, e.g. a self-hosted OpenAI-compatible name."""
    hosts = [h.strip().lower() for h in spec.split(",") if h.strip()]
    for h in hosts:
        if not _HOSTNAME.fullmatch(h):
            raise ValueError(f"not a hostname: {h!r}")
    return frozenset(PROVIDER_HOSTS) | frozenset(hosts)


def is_base_url_mode(flow: http.HTTPFlow) -> bool:
    return isinstance(flow.client_conn.proxy_mode, ReverseMode)


class Guard:
    def __init__(self) -> None:
        self.hosts = frozenset(PROVIDER_HOSTS)

    def load(self, loader) -> None:
        loader.add_option("polar_hosts", str, "", "Extra hostnames (comma-separated) to serve as LLM providers.")

    def configure(self, updated) -> None:
        # Lazy: the server connection opens only when a rewritten flow needs the engine, so a
        # CONNECT to a provider host never reaches out (DESIGN.md §8).
        if ctx.options.connection_strategy != "lazy":
            ctx.options.update(connection_strategy="lazy")
        if "polar_hosts" in updated:
            try:
                self.hosts = parse_hosts(ctx.options.polar_hosts)
            except ValueError as e:
                raise OptionsError(f"polar_hosts: {e}") from e

    def http_connect(self, flow: http.HTTPFlow) -> None:
        if flow.response:
            return
        if flow.request.host.lower() not in self.hosts:
            flow.response = http.Response.make(
                403, f"polar: {flow.request.host} is not an LLM provider this proxy serves\n",
                {"content-type": "text/plain"},
            )

    def request(self, flow: http.HTTPFlow) -> None:
        if flow.response:
            return
        headers = {k.lower(): v for k, v in flow.request.headers.items()}
        family = family_of(flow.request.pretty_host.lower(), headers, flow.request.path)
        if not is_base_url_mode(flow) and flow.request.pretty_host.lower() not in self.hosts:
            flow.response = error_response(family_api(family), 403, f"polar: {flow.request.pretty_host} is not served")
            return
        if headers.get("upgrade", "").lower() == "websocket":
            # codex tries a WebSocket first and falls back to plain POST when refused (DESIGN.md §7).
            flow.response = error_response(family_api(family), 403, "polar: WebSocket transport is not served")
            return
        route = match_route(flow.request.method, flow.request.path, family)
        if route is None:
            flow.response = error_response(
                family_api(family), 403, f"polar: {flow.request.method} {flow.request.path.split('?')[0]} is not served"
            )
            return
        flow.metadata["polar_route"] = route
