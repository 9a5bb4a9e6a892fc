"""Capture: each finished call's CallRecord goes to its session's file in the linear form (capture format 2,
polar_traj.captures.CaptureWriter), durable before the reply is released.

Group commit: one writer thread per capture folder takes every record queued since its last batch, appends
them (one open, flush and fsync per session file in the batch) and only then resolves each call's future, so
a record is on disk before the harness sees the reply, no fsync runs on the event loop, and under load many
calls share one fsync (a batch forms while the previous one is being synced). The calls of one batch are
woken with one wakeup of the event loop, not one each."""
from __future__ import annotations

import asyncio
import logging
import queue
import threading
from concurrent.futures import Future
from pathlib import Path

from mitmproxy import ctx
from mitmproxy.exceptions import OptionsError

from polar_traj.captures import CaptureWriter
from polar_traj.records import CallRecord

log = logging.getLogger(__name__)
RECENT = 2  # records per session the writer can refer back to (the proxy's parent is almost always the last)
MAX_SESSIONS = 4096  # sessions it remembers (each up to RECENT x 4 bytes an id, plus their requests)
MAX_BYTES = 32 * 2**20  # and about this much of their ids and requests (as JSON); the least recent go first
EXPECTED = (OSError, ValueError, UnicodeError)  # disk full, unsafe ids, unencodable text


def parse_capture_dir(spec: str) -> Path:
    path = Path(spec).expanduser()
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ValueError(f"cannot create {path}: {e.strerror}") from e
    return path


class CaptureError(Exception):
    """A record could not be written; the harness must not get a reply that was not recorded."""


class GroupWriter:
    """The writer thread of one capture folder. `submit` queues a record; its future resolves once the record
    is flushed and fsynced (to its path, or to the exception that kept it off the disk)."""

    def __init__(self, capture_dir: Path, fsync: bool = True) -> None:
        self.writer = CaptureWriter(capture_dir, recent=RECENT, max_sessions=MAX_SESSIONS, fsync=fsync,
                                    max_bytes=MAX_BYTES, shared=True)  # first calls refer to a harness's shared prompt
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="polar-capture", daemon=True)
        self._thread.start()

    def submit(self, record: CallRecord, extends: int = 0) -> Future:
        """For a caller that blocks until the record is durable."""
        future: Future = Future()
        self._queue.put((record, extends, future))
        return future

    def submit_async(self, record: CallRecord, extends: int = 0) -> asyncio.Future:
        """For a coroutine on the running loop: the returned future resolves there, with its batch."""
        future = asyncio.get_running_loop().create_future()
        self._queue.put((record, extends, future))
        return future

    def forget(self, task_id: str, session_id: str) -> None:
        self._queue.put((task_id, session_id))

    def close(self) -> None:
        """Write what is queued, then end the thread."""
        self._queue.put(None)
        self._thread.join(30)

    def _run(self) -> None:
        while True:
            batch = [self._queue.get()]
            while True:  # everything queued meanwhile joins this batch
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            calls = [item for item in batch if item is not None and len(item) == 3]
            for item in batch:
                if item is not None and len(item) == 2:
                    self.writer.forget(*item)
            if calls:
                self._commit(calls)
            if None in batch:
                return

    def _commit(self, calls: list[tuple[CallRecord, int, Future]]) -> None:
        try:
            results = self.writer.write_many([(record, extends or None) for record, extends, _ in calls])
        except Exception as e:  # a bug (or an injected fault): each record on its own, so one cannot sink the rest
            if len(calls) == 1:
                results = [e]
            else:
                results = []
                for record, extends, _ in calls:
                    try:
                        results += self.writer.write_many([(record, extends or None)])
                    except Exception as one:
                        results.append(one)
        waiting: dict[asyncio.AbstractEventLoop, list] = {}
        for (_, _, future), result in zip(calls, results):
            if isinstance(future, asyncio.Future):
                waiting.setdefault(future.get_loop(), []).append((future, result))
            else:
                _resolve(future, result)
        for loop, pairs in waiting.items():
            try:
                loop.call_soon_threadsafe(_resolve_all, pairs)
            except RuntimeError:  # the loop was closed (the proxy is shutting down): nobody waits any more
                pass


def _resolve(future: Future | asyncio.Future, result: object) -> None:
    if future.done():  # its caller stopped waiting (a cancelled call): the record is on disk all the same
        return
    if isinstance(result, BaseException):
        future.set_exception(result)
    else:
        future.set_result(result)


def _resolve_all(pairs: list[tuple[asyncio.Future, object]]) -> None:
    for future, result in pairs:
        _resolve(future, result)


class Capture:
    def __init__(self) -> None:
        self.capture_dir: Path | None = None
        self.writer: GroupWriter | None = None

    def load(self, loader) -> None:
        loader.add_option("polar_capture_dir", str, "captures", "Where CallRecords go: DIR/<task_id>/<session_id>.jsonl")

    def configure(self, updated) -> None:
        if "polar_capture_dir" in updated:
            try:
                capture_dir = parse_capture_dir(ctx.options.polar_capture_dir)
            except ValueError as e:
                raise OptionsError(f"polar_capture_dir: {e}") from e
            if capture_dir != self.capture_dir:
                old, self.capture_dir, self.writer = self.writer, capture_dir, GroupWriter(capture_dir)
                if old is not None:
                    old.close()

    def done(self) -> None:
        if self.writer is not None:
            self.writer.close()

    def _writer(self) -> GroupWriter:
        if self.writer is None:
            raise CaptureError("polar_capture_dir is not configured")
        return self.writer

    def write(self, record: CallRecord, extends: int = 0) -> None:
        """Write and wait (error paths, which are rare). Raises CaptureError."""
        self._check(record, self._writer().submit(record, extends))  # exception() waits for the batch

    async def commit(self, record: CallRecord, extends: int = 0) -> None:
        """Write in the next batch; returns once the record is durable. Raises CaptureError. Cancelled, the
        write still goes on."""
        future = self._writer().submit_async(record, extends)
        try:
            await future
        except Exception:
            pass
        self._check(record, future)

    def forget(self, task_id: str, session_id: str) -> None:
        if self.writer is not None:
            self.writer.forget(task_id, session_id)

    @staticmethod
    def _check(record: CallRecord, future: Future | asyncio.Future) -> None:
        e = future.exception()
        if e is None:
            return
        if isinstance(e, EXPECTED):
            log.error("polar: capture of call %s failed: %s", record.call_id, e)
            raise CaptureError(f"recording the call failed: {e}") from e
        log.error("polar: capture of call %s failed", record.call_id, exc_info=e)
        raise e
