"""The shared rendered-prefix cache: token ids of the part of a rendered prompt that many sessions share (the
harness's system prompt, its tool schema), tokenized once per proxy and reused, keyed by the text itself.

Every session's first call is rendered in full, and a harness starts every session with the same ~30k-token
preamble; tokenizing it is most of a first call's cost. A prompt text is cut only right after a special token
(`<|im_end|>`, `<|im_start|>`, ...): tokenizers split their input at special tokens before anything else, so
the ids of `head + tail` are the ids of `head` followed by those of `tail`. That is checked, not assumed: the
first `VERIFY` times a prefix is cached, the prompt is also tokenized whole and compared, and a tokenizer for
which the two ever differ (say one that marks the start of every piece of text) gets no cache at all. Bounded: at most
`max_ids` ids in at most `max_entries` prefixes, least recently used dropped first. Ids are kept as tuples
(about 36 bytes an id, against 4 in an array) because a hit then costs a pointer copy instead of
rebuilding 30k Python ints (~1 ms a call each way).
"""
from __future__ import annotations

import hashlib
import json
import logging
import re
import threading
from collections import OrderedDict
from typing import Any, Callable

import orjson

log = logging.getLogger(__name__)
BYTES_PER_ID = 36  # an id in an entry's tuple: its pointer and its own int (tuples: a hit is a pointer copy)
MAX_IDS = 1_000_000  # about 36 MB of ids
MAX_ENTRIES = 256
MIN_CHARS = 4096  # shorter prefixes cost little to tokenize: not worth an entry
VERIFY = 8  # prefixes cached with the whole prompt also tokenized and compared (the split is the tokenizer's)


def split_tokens(tokenizer: Any) -> list[str]:
    """The special tokens a prompt may be cut after: those that do not swallow the whitespace after them."""
    decoder = getattr(tokenizer, "added_tokens_decoder", None) or {}
    return sorted({t.content for t in decoder.values()
                   if getattr(t, "special", False) and not getattr(t, "rstrip", False) and t.content})


class PrefixCache:
    def __init__(self, encode: Callable[[str], list[int]], specials: list[str], max_ids: int = MAX_IDS,
                 max_entries: int = MAX_ENTRIES, min_chars: int = MIN_CHARS) -> None:
        self._encode = encode
        self._split = re.compile("|".join(map(re.escape, sorted(specials, key=len, reverse=True)))) if specials else None
        self.max_ids, self.max_entries, self.min_chars = max_ids, max_entries, min_chars
        self._entries: OrderedDict[bytes, tuple[int, ...]] = OrderedDict()
        self._ids = 0  # ids held by all entries
        self._lock = threading.Lock()  # renders run on the event loop and on the large-call pool
        self.enabled = self._split is not None
        self.hits = self.misses = self.verified = 0

    def encode(self, text: str, shared_until: int) -> list[int]:
        """The ids of `text`, exactly as a whole tokenization gives them. `shared_until`: where the part other
        sessions are likely to share ends (e.g. where the last message begins); a miss caches the prefix up
        to the last cut point at or before it."""
        cuts = self._cuts(text) if self.enabled else []
        if not cuts:
            return self._encode(text)
        found, keys = None, []
        h, pos = hashlib.blake2b(digest_size=16), 0
        for cut in cuts:  # hashed incrementally: all cut points cost one pass over the text
            h.update(text[pos:cut].encode("utf-8", "surrogatepass"))
            pos = cut
            key = h.copy().digest()
            keys.append(key)
            if key in self._entries:
                found = (cut, key)
        if found is not None:
            with self._lock:
                head = self._entries.get(found[1])
                if head is not None:
                    self._entries.move_to_end(found[1])
                    self.hits += 1
            if head is not None:
                return [*head, *self._encode(text[found[0]:])]
        self.misses += 1
        at = max((i for i, cut in enumerate(cuts) if cut <= shared_until), default=None)
        if at is None:
            return self._encode(text)
        return self._insert(text, cuts[at], keys[at])

    def _cuts(self, text: str) -> list[int]:
        return [m.end() for m in self._split.finditer(text) if m.end() >= self.min_chars]

    def _insert(self, text: str, cut: int, key: bytes) -> list[int]:
        head = self._encode(text[:cut])
        ids = head + self._encode(text[cut:])
        if self.verified < VERIFY:
            whole = self._encode(text)
            if whole != ids:  # this tokenizer does not split there: never cut its prompts
                self.enabled = False
                log.warning("polar: the tokenizer does not split prompts at special tokens; "
                            "the shared-prefix cache is off")
                return whole
            self.verified += 1
        if len(head) <= self.max_ids:
            with self._lock:
                if key not in self._entries:
                    self._entries[key] = tuple(head)
                    self._ids += len(head)
                while self._ids > self.max_ids or len(self._entries) > self.max_entries:
                    _, old = self._entries.popitem(last=False)
                    self._ids -= len(old)
        return ids

    @property
    def size(self) -> tuple[int, int]:
        """(prefixes, ids) held now."""
        return len(self._entries), self._ids


class RenderCache:
    """Whole prompts by the exact input of the chat template (its messages and tools, as JSON): the samples of
    one task (a GRPO group) and a harness's fixed side calls send the same first call again and again, and
    get its ids without rendering or tokenizing. Bounded like PrefixCache."""

    def __init__(self, max_ids: int = MAX_IDS, max_entries: int = 1024) -> None:
        self.max_ids, self.max_entries = max_ids, max_entries
        self._entries: OrderedDict[bytes, tuple[int, ...]] = OrderedDict()
        self._ids = 0
        self._lock = threading.Lock()
        self.hits = 0

    @staticmethod
    def key(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> bytes:
        try:
            data = orjson.dumps([messages, tools])
        except TypeError:  # lone surrogates, ints past 64 bits: the stdlib writes them (escaped, so one-to-one)
            data = json.dumps([messages, tools], ensure_ascii=True).encode("ascii")
        return hashlib.blake2b(data, digest_size=16).digest()

    def get(self, key: bytes) -> list[int] | None:
        with self._lock:
            ids = self._entries.get(key)
            if ids is None:
                return None
            self._entries.move_to_end(key)
            self.hits += 1
        return list(ids)

    def put(self, key: bytes, ids: list[int]) -> None:
        if len(ids) > self.max_ids:
            return
        with self._lock:
            if key in self._entries:
                return
            self._entries[key] = tuple(ids)
            self._ids += len(ids)
            while self._ids > self.max_ids or len(self._entries) > self.max_entries:
                _, old = self._entries.popitem(last=False)
                self._ids -= len(old)
