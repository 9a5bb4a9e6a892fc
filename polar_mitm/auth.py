"""Session identity: maps each flow's credentials to a registered rollout session (DESIGN.md §2)."""
from __future__ import annotations

import logging

from mitmproxy import connection, ctx, http
from mitmproxy.exceptions import OptionsError

from polar_mitm.guard import is_base_url_mode
from polar_mitm.replies import error_response
from polar_mitm.sessions import (
    Credentials, OpenSessions, Session, SessionStore, api_key_credentials, parse_sessions_spec, proxy_credentials, session_hint,
)

SECRET_HEADERS = ("authorization", "x-api-key", "x-goog-api-key", "proxy-authorization", "cookie")
log = logging.getLogger(__name__)


class SessionAuth:
    def __init__(self) -> None:
        self.store: SessionStore = OpenSessions()
        self.by_conn: dict[str, Session] = {}  # proxy mode: CONNECT credentials hold for the whole tunnel

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

    def http_connect(self, flow: http.HTTPFlow) -> None:
        if flow.response:
            return
        creds = proxy_credentials(flow.request.headers.get("proxy-authorization"))
        session = self.store.lookup(creds, None) if creds else None
        if session is None and not isinstance(self.store, OpenSessions):
            flow.response = http.Response.make(
                407, b"polar: proxy credentials http://<session>:<token>@host:port required\n",
                {"proxy-authenticate": 'Basic realm="polar"', "content-type": "text/plain"},
            )
            return
        if session is not None:
            self.by_conn[flow.client_conn.id] = session

    def client_disconnected(self, client: connection.Client) -> None:
        self.by_conn.pop(client.id, None)

    def request(self, flow: http.HTTPFlow) -> None:
        if flow.response or "polar_route" not in flow.metadata:
            return
        headers = {k.lower(): v for k, v in flow.request.headers.items()}
        session = self._resolve(flow, headers)
        for name in SECRET_HEADERS:
            flow.request.headers.pop(name, None)
        if session is None:
            status = 401 if is_base_url_mode(flow) else 407
            api = flow.metadata["polar_route"].api  # Guard matched the route: answer in its provider's shape
            flow.response = error_response(api, status, "polar: unknown session credentials")
            return
        flow.metadata["polar_session"] = session

    def _resolve(self, flow: http.HTTPFlow, headers: dict[str, str]) -> Session | None:
        hint = session_hint(headers)
        if not is_base_url_mode(flow):
            if flow.client_conn.id in self.by_conn:
                return self.by_conn[flow.client_conn.id]
            creds = proxy_credentials(headers.get("proxy-authorization"))  # absolute-form plain HTTP
            if creds:
                return self.store.lookup(creds, hint)
        creds = api_key_credentials(headers, flow.request.url)
        if creds is None and not isinstance(self.store, OpenSessions):
            return None
        return self.store.lookup(creds or Credentials(None, None), hint)
