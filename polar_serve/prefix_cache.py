"""A bounded prefix cache of KV states. A finished sequence leaves its KV cache here, keyed by the token ids it
covers; a new prompt reuses the entry sharing the longest prefix with it (a cropped copy: entries are never
changed), so the model runs only on the rest. A coding agent's next prompt is its previous prompt + output + a
few new tokens, so this cuts prefill to the new tokens. Bounded by the bytes of the KV tensors, least recently
used entries go first. Not thread-safe: the server's worker thread is the only one that touches it."""
from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import torch

log = logging.getLogger("polar_serve")


@dataclass(frozen=True)
class Entry:
    ids: torch.Tensor  # int64, the token ids the KV states cover, in order
    cache: Any  # a transformers DynamicCache holding exactly len(ids) positions; never mutated once stored
    nbytes: int


@dataclass(frozen=True)
class Flushed:
    entries: int
    tokens: int
    nbytes: int


def _layers(cache: Any) -> list[Any] | None:
    """The cache's layers when every one is a plain full-attention DynamicLayer (croppable); None otherwise
    (sliding-window, static, recurrent caches are not reused)."""
    from transformers.cache_utils import DynamicLayer

    layers = getattr(cache, "layers", None)
    if not layers or any(type(layer) is not DynamicLayer or not layer.is_initialized for layer in layers):
        return None
    return list(layers)


def kv_bytes(cache: Any) -> int:
    return sum(t.numel() * t.element_size() for layer in _layers(cache) or [] for t in (layer.keys, layer.values))


def common_prefix(a: torch.Tensor, b: torch.Tensor) -> int:
    n = min(len(a), len(b))
    differ = torch.nonzero(a[:n] != b[:n])
    return int(differ[0, 0]) if len(differ) else n


def cropped_copy(cache: Any, length: int, config: Any) -> Any:
    """A new DynamicCache with the first `length` positions of `cache` (new tensors: the original is untouched)."""
    from transformers import DynamicCache

    data = [(layer.keys[:, :, :length, :].clone(), layer.values[:, :, :length, :].clone())
            for layer in _layers(cache) or []]
    return DynamicCache(data, config=config)


class PrefixCache:
    """Entries and matches are whole blocks of `block` positions (the engine's prefill chunks)."""

    def __init__(self, max_bytes: int, block: int = 1) -> None:
        self.max_bytes = max(0, max_bytes)
        self.block = max(1, block)
        self._entries: OrderedDict[int, Entry] = OrderedDict()  # least recently used first
        self._next_key = 0
        self.nbytes = 0

    @property
    def enabled(self) -> bool:
        return self.max_bytes > 0

    def __len__(self) -> int:
        return len(self._entries)

    def entries(self) -> tuple[Entry, ...]:
        """Least recently used first."""
        return tuple(self._entries.values())

    def lookup(self, ids: list[int], limit: int, config: Any) -> tuple[int, Any]:
        """(n, cache): a fresh DynamicCache holding the KV of ids[:n], with n the longest prefix any entry shares
        with ids, at most `limit` (the caller keeps at least the last prompt token to run, for the next-token
        logits), in whole blocks; (0, None) on a miss."""
        if not self._entries or limit < 1:
            return 0, None
        wanted = torch.tensor(ids, dtype=torch.long)
        best_key, best = None, 0
        for key, entry in self._entries.items():
            n = common_prefix(entry.ids, wanted)
            if n > best:
                best_key, best = key, n
        best = min(best, limit) // self.block * self.block
        if best_key is None or best == 0:
            return 0, None
        self._entries.move_to_end(best_key)
        return best, cropped_copy(self._entries[best_key].cache, best, config)

    def store(self, ids: list[int], cache: Any, config: Any) -> bool:
        """Keep the KV of ids (the first len(ids) positions of `cache`, which the caller no longer changes).
        Entries that are a prefix of the new one are dropped (it serves every prompt they could); a new one that
        is a prefix of an entry is not kept. Returns whether it was stored."""
        if not self.enabled or not ids or _layers(cache) is None or cache.get_seq_length() < len(ids):
            return False
        if cache.get_seq_length() > len(ids):
            cache = cropped_copy(cache, len(ids), config)
        nbytes = kv_bytes(cache)
        if nbytes > self.max_bytes:
            return False
        new_ids = torch.tensor(ids, dtype=torch.long)
        for key, entry in list(self._entries.items()):
            n = common_prefix(entry.ids, new_ids)
            if n == len(new_ids):  # already covered by a longer (or equal) entry
                self._entries.move_to_end(key)
                return False
            if n == len(entry.ids):
                self._drop(key)
        self._entries[self._next_key] = Entry(new_ids, cache, nbytes)
        self._next_key += 1
        self.nbytes += nbytes
        while self.nbytes > self.max_bytes:
            self._drop(next(iter(self._entries)))
        return True

    def _drop(self, key: int) -> None:
        self.nbytes -= self._entries.pop(key).nbytes

    def flush(self, reason: str) -> Flushed:
        flushed = Flushed(len(self._entries), sum(len(e.ids) for e in self._entries.values()), self.nbytes)
        self._entries.clear()
        self.nbytes = 0
        log.info("prefix cache flushed (%s): %d entries, %d tokens, %.1f MB", reason, flushed.entries,
                 flushed.tokens, flushed.nbytes / 2**20)
        return flushed
