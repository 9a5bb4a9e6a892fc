"""Session identity: maps each flow's credentials to a registered rollout session (docs/design.md §2).

A routed flow leaves this addon with a session or with a local answer (407/401, or 503 when the session store
cannot be asked), and without its credential headers, whatever the credentials hold. An LLM call of a session
with a call cap is counted here (`polar_call_number`); the router refuses the calls past the cap."""
from __future__ import annotations

import logging

from mitmproxy import connection, ctx, http
from mitmproxy.exceptions import OptionsError

from polar_mitm.gate.guard import is_base_url_mode, request_headers
from polar_mitm.providers.responses import error_response
from polar_mitm.sessions.registry import (
    Credentials, OpenSessions, RedisSessions, Session, SessionStoreError, api_key_credentials, parse_sessions_spec,
    proxy_credentials, session_hint,
)

SECRET_HEADERS = ("authorization", "x-api-key", "x-goog-api-key", "proxy-authorization", "cookie")
log = logging.getLogger(__name__)


class SessionAuth:
    def __init__(self) -> None:
        self.store: OpenSessions | RedisSessions = OpenSessions()
        # proxy mode: the CONNECT's credentials, checked again on every request of the tunnel
        self.by_conn: dict[str, Credentials] = {}

    def load(self, loader) -> None:
        loader.add_option(
            "polar_sessions", str, "open",
            "'open' (any credential becomes a session; local use) or a redis:// URL where workers register sessions.",
        )

    def configure(self, updated) -> None:
        if "polar_sessions" in updated:
            try:
                self.store = parse_sessions_spec(ctx.options.polar_sessions)
            except ValueError as e:
                raise OptionsError(f"polar_sessions: {e}") from e

    async def http_connect(self, flow: http.HTTPFlow) -> None:
        if flow.response:
            return
        creds = proxy_credentials(flow.request.headers.get("proxy-authorization"))
        if creds is None and isinstance(self.store, OpenSessions):
            return
        try:
            session = await self.store.lookup(creds, None) if creds else None
        except SessionStoreError as e:
            log.error("polar: %s", e)
            flow.response = http.Response.make(503, b"polar: session store unavailable\n", {"content-type": "text/plain"})
            return
        if session is None:
            flow.response = http.Response.make(
                407, b"polar: proxy credentials http://<session>:<token>@host:port required\n",
                {"proxy-authenticate": 'Basic realm="polar"', "content-type": "text/plain"},
            )
            return
        self.by_conn[flow.client_conn.id] = creds

    def client_disconnected(self, client: connection.Client) -> None:
        self.by_conn.pop(client.id, None)

    async def request(self, flow: http.HTTPFlow) -> None:
        if flow.response or "polar_route" not in flow.metadata:
            return
        headers = request_headers(flow)
        flow.metadata.pop("polar_headers", None)  # it holds the credentials, which leave the request here
        for name in SECRET_HEADERS:
            flow.request.headers.pop(name, None)
        api = flow.metadata["polar_route"].api  # Guard matched the route: answer in its provider's shape
        try:
            session = await self._resolve(flow, headers)
        except SessionStoreError as e:
            log.error("polar: %s", e)
            flow.response = error_response(api, 503, "polar: session store unavailable", "overloaded_error")
            return
        if session is None:
            status = 401 if is_base_url_mode(flow) else 407
            flow.response = error_response(api, status, "polar: unknown session credentials")
            return
        if session.max_calls is not None and flow.metadata["polar_route"].kind == "generate":
            try:  # the router refuses a call past the cap (polar_mitm/router.py), and records it
                flow.metadata["polar_call_number"] = await self.store.count_call(session)
            except SessionStoreError as e:
                log.error("polar: %s", e)
                flow.response = error_response(api, 503, "polar: session store unavailable", "overloaded_error")
                return
        flow.metadata["polar_session"] = session

    async def _resolve(self, flow: http.HTTPFlow, headers: dict[str, str]) -> Session | None:
        hint = session_hint(headers)
        if not is_base_url_mode(flow):
            creds = self.by_conn.get(flow.client_conn.id) or proxy_credentials(headers.get("proxy-authorization"))
            if creds:
                return await self.store.lookup(creds, hint)
        creds = api_key_credentials(headers, flow.request.url)
        if creds is None and not isinstance(self.store, OpenSessions):
            return None
        return await self.store.lookup(creds or Credentials(None, None), hint)
