"""polar_mitm.sessions.cache: the LRU of session histories, bounded by count, idle time and total weight."""
from __future__ import annotations

from polar_mitm.sessions.cache import SessionCache


class Box:
    def __init__(self, evicted: bool) -> None:
        self.evicted, self.size = evicted, 10


def cache(max_weight: int) -> SessionCache[str, Box]:
    return SessionCache(Box, weigh=lambda b: b.size, max_weight=max_weight)


def test_the_least_recently_used_go_past_the_weight():
    c = cache(max_weight=35)
    for k in "abc":
        c.get(k)
    assert len(c) == 3 and c.weight == 30
    c.get("a")  # a is the most recent now
    c.get("d")  # 40 > 35: b, the least recently used, goes
    assert c.peek("b") is None and c.weight == 30 and c.evictions == 1
    assert c.get("b").evicted  # back: a new history, labelled evicted


def test_a_grown_entry_is_reweighed_and_never_evicts_itself():
    c = cache(max_weight=35)
    a, _ = c.get("a"), c.get("b")
    a.size = 100  # one session alone over the budget
    c.reweigh("a")
    assert c.peek("a") is a and c.peek("b") is None and c.weight == 100  # the others go, not the one in use
    c.get("c")
    assert c.peek("a") is None and c.weight == 10  # ... and it is the next to go


def test_an_ended_session_frees_its_weight():
    c = cache(max_weight=0)  # no bound: still counted
    c.get("a"), c.get("b")
    c.drop("a")
    assert c.weight == 10 and not c.get("a").evicted and c.evictions == 0
