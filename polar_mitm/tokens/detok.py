"""Incremental detokenization: text deltas from token ids as they stream in."""
from __future__ import annotations

from typing import Any


class Detokenizer:
    """Decodes only a short window of ids per step and holds back an incomplete UTF-8 character,
    so the deltas concatenate to exactly `tokenizer.decode(all_ids)`."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self._prefix = 0  # start of the decoding window
        self._read = 0  # ids already turned into emitted text
        self.text = ""

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def feed(self, ids: list[int]) -> str:
        self.ids.extend(ids)
        window_before = self._decode(self.ids[self._prefix:self._read])
        window_now = self._decode(self.ids[self._prefix:])
        if window_now.endswith("\ufffd"):
            return ""  # a multi-byte character is split across tokens: wait for the rest
        delta = window_now[len(window_before):]
        self._prefix, self._read = self._read, len(self.ids)
        self.text += delta
        return delta

    def flush(self) -> str:
        """Whatever is still held back (e.g. output cut mid-character) once no more ids will come."""
        full = self._decode(self.ids)
        delta = full[len(self.text):] if full.startswith(self.text) else ""
        self.text += delta
        return delta
