"""A sandbox's stdout and stderr, captured with a cap (issue 23): the first `head` bytes go to the file as they
come, then only the last `tail` bytes are kept, written after one line that says how much was cut. A harness
that prints without end fills neither the node's disk nor our memory.
"""
from __future__ import annotations

import threading
from typing import BinaryIO

HEAD_BYTES = 4 << 20
TAIL_BYTES = 4 << 20
CHUNK = 1 << 16


def cut_line(dropped: int) -> bytes:
    return f"\n[polar: {dropped} bytes of output cut here; the first and last bytes are kept]\n".encode()


class CappedCopy:
    """Copies a pipe into an open file in a thread (closing both at the end), keeping the head and the tail."""

    def __init__(self, pipe: BinaryIO, out: BinaryIO, head: int = HEAD_BYTES, tail: int = TAIL_BYTES) -> None:
        self.pipe, self.out, self.head, self.tail = pipe, out, head, tail
        self.dropped = 0
        self.thread = threading.Thread(target=self._copy, name="capture", daemon=True)
        self.thread.start()

    def _copy(self) -> None:
        kept = bytearray()
        written = 0
        with self.out as out:
            while chunk := self.pipe.read1(CHUNK):
                if written < self.head:
                    part = chunk[:self.head - written]
                    out.write(part)
                    out.flush()
                    written += len(part)
                    chunk = chunk[len(part):]
                kept += chunk
                if len(kept) > self.tail:
                    self.dropped += len(kept) - self.tail
                    del kept[:len(kept) - self.tail]
            if self.dropped:
                out.write(cut_line(self.dropped))
            out.write(kept)
        self.pipe.close()

    def wait(self, timeout_s: float = 10.0) -> None:
        """Until the pipe's last writer has gone (a process left holding it is the caller's to kill first)."""
        self.thread.join(timeout_s)
