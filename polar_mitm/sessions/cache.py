"""Bounded per-session state: the proxy serves training runs of unbounded length, so session histories live
in an LRU with an idle TTL, and a session that ends (unregistered in Redis) is freed at once. A session
that comes back after eviction starts a new history whose first prompt is rendered in full and labelled
`rendered:evicted`, so its tokens stay exact. With a weight (bytes) per entry and `max_weight`, the least
recently used entries also go while the entries together weigh more (polar_memory_budget)."""
from __future__ import annotations

import time
from collections import OrderedDict
from typing import Generic, Callable, TypeVar

K = TypeVar("K")
V = TypeVar("V")

EVICTED_MEMORY = 8  # remember this many times max_entries evicted keys (a key is ~100 bytes)


class SessionCache(Generic[K, V]):
    def __init__(self, make: Callable[[bool], V], max_entries: int = 10_000, ttl_s: float = 3600.0,
                 weigh: Callable[[V], int] | None = None, max_weight: int = 0) -> None:
        self.make, self.max_entries, self.ttl_s = make, max_entries, ttl_s
        self.weigh, self.max_weight = weigh, max_weight  # max_weight 0: no bound on the total
        self._items: OrderedDict[K, tuple[float, V]] = OrderedDict()
        self._evicted: OrderedDict[K, None] = OrderedDict()
        self._weights: dict[K, int] = {}  # each entry's weight when last counted (get, reweigh)
        self.weight = 0  # their sum
        self.evictions = 0  # entries dropped for the bounds (not ended sessions)

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
        self._count(key, value)
        self._expire(now, keep=key)
        return value

    def reweigh(self, key: K) -> None:
        """The entry changed size (a session remembered a call): count it again, and drop the least recently used
        others while the total is over `max_weight`."""
        hit = self._items.get(key)
        if hit is not None:
            self._count(key, hit[1])
            self._expire(time.monotonic(), keep=key)

    def _count(self, key: K, value: V) -> None:
        if self.weigh is not None:
            weight = self.weigh(value)
            self.weight += weight - self._weights.get(key, 0)
            self._weights[key] = weight

    def peek(self, key: K) -> V | None:
        hit = self._items.get(key)
        return hit[1] if hit else None

    def values(self) -> list[V]:
        return [value for _, value in self._items.values()]

    def drop(self, key: K) -> None:
        """An ended session: free it, and never label a reuse of the key as evicted."""
        self._items.pop(key, None)
        self._evicted.pop(key, None)
        self.weight -= self._weights.pop(key, 0)

    def _expire(self, now: float, keep: K | None = None) -> None:
        """Least recently used first: entries past the count, idle past the TTL, or over the weight; never `keep`
        (the entry in use: it may weigh more than the bound alone, and is then the next to go). Looks only at the
        oldest entry each time: a call costs O(1) unless something goes."""
        while self._items:
            key, (seen, _) = next(iter(self._items.items()))
            over = self.max_weight and self.weight > self.max_weight
            if not over and len(self._items) <= self.max_entries and now - seen <= self.ttl_s:
                break
            if key == keep:
                if len(self._items) == 1:
                    break
                self._items.move_to_end(key)  # in use: the most recent, whatever its clock says
                continue
            del self._items[key]
            self.weight -= self._weights.pop(key, 0)
            self.evictions += 1
            self._evicted[key] = None
            if len(self._evicted) > EVICTED_MEMORY * self.max_entries:
                self._evicted.popitem(last=False)
