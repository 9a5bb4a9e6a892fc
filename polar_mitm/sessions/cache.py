"""Bounded per-session state: the proxy serves training runs of unbounded length, so session histories live
in an LRU with an idle TTL, and a session that ends (unregistered in Redis) is freed at once. A session
that comes back after eviction starts a new history whose first prompt is rendered in full and labelled
`rendered:evicted`, so its tokens stay exact."""
from __future__ import annotations

import time
from collections import OrderedDict
from typing import Generic, Callable, TypeVar

K = TypeVar("K")
V = TypeVar("V")

EVICTED_MEMORY = 8  # remember this many times max_entries evicted keys (a key is ~100 bytes)


class SessionCache(Generic[K, V]):
    def __init__(self, make: Callable[[bool], V], max_entries: int = 10_000, ttl_s: float = 3600.0) -> None:
        self.make, self.max_entries, self.ttl_s = make, max_entries, ttl_s
        self._items: OrderedDict[K, tuple[float, V]] = OrderedDict()
        self._evicted: OrderedDict[K, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._items)

    def get(self, key: K) -> V:
        """The entry for `key`, created (`make(evicted)`) when missing; refreshes its place and idle clock."""
        now = time.monotonic()
        hit = self._items.pop(key, None)
        if hit is not None:
            value = hit[1]
        else:
            was_evicted = key in self._evicted
            self._evicted.pop(key, None)
            value = self.make(was_evicted)
        self._items[key] = (now, value)
        self._expire(now)
        return value

    def peek(self, key: K) -> V | None:
        hit = self._items.get(key)
        return hit[1] if hit else None

    def values(self) -> list[V]:
        return [value for _, value in self._items.values()]

    def drop(self, key: K) -> None:
        """An ended session: free it, and never label a reuse of the key as evicted."""
        self._items.pop(key, None)
        self._evicted.pop(key, None)

    def _expire(self, now: float) -> None:
        while self._items:
            key, (seen, _) = next(iter(self._items.items()))
            if len(self._items) <= self.max_entries and now - seen <= self.ttl_s:
                break
            del self._items[key]
            self._evicted[key] = None
            if len(self._evicted) > EVICTED_MEMORY * self.max_entries:
                self._evicted.popitem(last=False)
