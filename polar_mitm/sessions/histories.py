"""The session histories the proxy keeps, and their bounds: an idle TTL (`polar_session_ttl`), a count
(`polar_max_sessions`) and bytes (`polar_memory_budget`, shared with the prompt caches and the capture writer at
their fixed bounds). A session past them starts a new history, its next prompt rendered in full
(sessions/cache.py)."""
from __future__ import annotations

from mitmproxy import ctx
from mitmproxy.exceptions import OptionsError

from polar_mitm.capture import MAX_BYTES as CAPTURE_MAX_BYTES
from polar_mitm.sessions.cache import SessionCache
from polar_mitm.tokens.prefix_cache import BYTES_PER_ID as CACHE_BYTES_PER_ID
from polar_mitm.tokens.prefix_cache import MAX_IDS
from polar_mitm.tokens.prompt import SessionHistory

# what the budget holds besides histories, at their fixed bounds: the shared-prefix and render caches' ids and
# the capture writer's remembered records
FIXED_BYTES = 2 * MAX_IDS * CACHE_BYTES_PER_ID + CAPTURE_MAX_BYTES


def parse_positive(value: int) -> int:
    if value <= 0:
        raise ValueError(f"expected a positive number, got {value}")
    return value


def histories_budget(budget: int) -> int:
    """Bytes left to session histories by a polar_memory_budget (0: unbounded); ValueError when the budget does
    not even hold the caches."""
    if budget < 0:
        raise ValueError(f"expected 0 (no bound) or a number of bytes, got {budget}")
    if budget and budget <= FIXED_BYTES:
        raise ValueError(f"{budget} bytes does not hold the prompt caches and the capture writer "
                         f"({FIXED_BYTES / 2**20:.0f} MB at their fixed bounds): give more")
    return budget - FIXED_BYTES if budget else 0


class Histories(SessionCache[tuple[str, str], SessionHistory]):
    """Each session's history, by (task_id, session_id)."""

    def __init__(self) -> None:
        super().__init__(SessionHistory, weigh=SessionHistory.nbytes)

    def load(self, loader) -> None:
        loader.add_option("polar_session_ttl", int, 3600, "Seconds an idle session's history is kept.")
        loader.add_option("polar_max_sessions", int, 10000, "Most session histories kept (least recently used go).")
        loader.add_option("polar_memory_budget", int, 0,
                          "Bytes for session histories, prompt caches and the capture writer together; past it the "
                          "least recently used sessions' histories go (their next call rendered in full, "
                          "rendered:evicted). 0 = no bound but polar_max_sessions.")

    def configure(self, updated) -> None:
        for name, parse, attr in (("polar_session_ttl", parse_positive, "ttl_s"),
                                  ("polar_max_sessions", parse_positive, "max_entries"),
                                  ("polar_memory_budget", histories_budget, "max_weight")):
            if name in updated:
                try:
                    setattr(self, attr, parse(getattr(ctx.options, name)))
                except ValueError as e:
                    raise OptionsError(f"{name}: {e}") from e
