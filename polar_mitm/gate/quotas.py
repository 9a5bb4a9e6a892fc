"""Per-session quotas: one session's calls cannot take the proxy from the others (calls in flight, and request
bytes per minute). Over a quota, the call is refused with the provider's 429 and recorded, before its body is
parsed. The calls-per-session cap lives with the session (polar_mitm/gate/auth.py, router.check_call_cap)."""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from mitmproxy import ctx, http
from mitmproxy.exceptions import OptionsError

from polar_mitm.conversation import ProviderError

WINDOW_S = 60.0
# A flow that ended without mitmproxy's response or error hook must not hold its session's slot for ever;
# no call lives this long (the engine timeout defaults to 600 s).
STALE_S = 1800.0
SWEEP_EVERY = 1024  # admits between sweeps of sessions that went quiet
Key = tuple[str, str]  # (task_id, session_id)


@dataclass(slots=True)
class _Usage:
    """A session's calls in flight, and its body bytes over a sliding minute: this minute's count plus the
    last minute's, weighted by how much of it is still inside the window (a few dozen bytes a session, since
    the table holds every session of the last minute)."""

    flows: dict[str, float] = field(default_factory=dict)  # flow id -> admitted at (monotonic): in flight
    minute: float = 0.0  # start of the current 60 s bucket
    this_bytes: int = 0
    last_bytes: int = 0

    def prune(self, now: float) -> None:
        if now - self.minute >= WINDOW_S:
            elapsed = int((now - self.minute) // WINDOW_S)
            self.last_bytes = self.this_bytes if elapsed == 1 else 0
            self.this_bytes, self.minute = 0, self.minute + elapsed * WINDOW_S
        for flow_id in [f for f, at in self.flows.items() if at <= now - STALE_S]:
            del self.flows[flow_id]

    def window_bytes(self, now: float) -> int:
        return self.this_bytes + int(self.last_bytes * max(0.0, 1 - (now - self.minute) / WINDOW_S))

    def add(self, size: int) -> None:
        self.this_bytes += size

    @property
    def idle(self) -> bool:
        return not self.flows and not self.this_bytes and not self.last_bytes


def parse_quota(value: int) -> int:
    if value < 0:
        raise ValueError(f"expected 0 (no limit) or a positive number, got {value}")
    return value


class SessionQuotas:
    def __init__(self) -> None:
        self.max_inflight = 4
        self.bytes_per_minute = 128 * 2**20
        self._usage: dict[Key, _Usage] = {}
        self._admits = 0

    def load(self, loader) -> None:
        loader.add_option("polar_session_max_inflight", int, 4,
                          "LLM calls one session may have in flight at once (429 beyond); 0 = no limit.")
        loader.add_option("polar_session_bytes_per_minute", int, 128 * 2**20,
                          "Request body bytes one session may send in any 60 s (429 beyond); 0 = no limit.")

    def configure(self, updated) -> None:
        for name, attr in (("polar_session_max_inflight", "max_inflight"),
                           ("polar_session_bytes_per_minute", "bytes_per_minute")):
            if name in updated:
                try:
                    setattr(self, attr, parse_quota(getattr(ctx.options, name)))
                except ValueError as e:
                    raise OptionsError(f"{name}: {e}") from e

    def admit(self, flow: http.HTTPFlow, key: Key, size: int) -> None:
        """Count the call against its session, or raise the provider's 429. An admitted flow is released by
        `release` when it ends (response or error hook), exactly once."""
        now = time.monotonic()
        self._admits += 1
        if self._admits % SWEEP_EVERY == 0:
            self._sweep(now)
        usage = self._usage.get(key)
        if usage is None:
            usage = self._usage[key] = _Usage(minute=now)
        usage.prune(now)
        if self.max_inflight and len(usage.flows) >= self.max_inflight:
            raise ProviderError(429, f"polar: this session has {len(usage.flows)} calls in flight, the most the "
                                     "proxy allows one session (polar_session_max_inflight); retry when one ends")
        sent = usage.window_bytes(now)
        if self.bytes_per_minute and sent + size > self.bytes_per_minute:
            raise ProviderError(429, f"polar: this session sent {sent} request bytes in the last "
                                     f"{WINDOW_S:.0f} s; {size} more exceed its quota of {self.bytes_per_minute} "
                                     "(polar_session_bytes_per_minute)")
        usage.flows[flow.id] = now
        usage.add(size)
        flow.metadata["polar_quota_key"] = key

    def release(self, flow: http.HTTPFlow) -> None:
        key = flow.metadata.pop("polar_quota_key", None)
        usage = self._usage.get(key) if key is not None else None
        if usage is None:
            return
        usage.flows.pop(flow.id, None)
        usage.prune(time.monotonic())
        if usage.idle:
            del self._usage[key]

    def _sweep(self, now: float) -> None:
        """Forget sessions with nothing in flight or in the window: the table holds the last minute's sessions."""
        for key in list(self._usage):
            self._usage[key].prune(now)
            if self._usage[key].idle:
                del self._usage[key]
