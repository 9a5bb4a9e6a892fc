"""A node's heartbeat: a thread in the worker's main process that, every POLAR_HEARTBEAT_S,
  - refreshes the node's heartbeat key (TTL POLAR_LIVENESS_S) with the samples it holds,
  - reassigns what lost nodes held (workers.steps.reap), once it has itself been connected for a whole liveness
    timeout (after a Redis outage every heartbeat may have lapsed, and the others need one beat to come back),
  - drains: asked by `polar node drain` or by SIGTERM, it stops consuming the shared `prepare` queue, lets its
    samples finish through their own queues, and at the deadline hands over what is left (stopping those
    harnesses); after a SIGTERM the worker then shuts down as Celery does.
"""
from __future__ import annotations

import logging
import os
import signal
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import redis

from workers import batches, liveness, steps
from workers.announce import say, status_line
from workers.node import proxy_statuses
from workers.settings import WorkerSettings

log = logging.getLogger(__name__)


@dataclass
class Heartbeat:
    settings: WorkerSettings
    r: redis.Redis
    enqueue: steps.Enqueue
    revoke: steps.Revoke
    consume_prepare: Callable[[bool], None] = lambda on: None  # start/stop taking the shared prepare queue
    started_at: float = field(default_factory=time.time)
    stopped: threading.Event = field(default_factory=threading.Event)
    terminating: bool = False  # SIGTERM: shut down once drained
    draining: bool = False
    handed_over: bool = False
    connected_since: float | None = None
    thread: threading.Thread | None = None
    last_status: float = field(default_factory=time.monotonic)  # the start-up line was the first

    @property
    def node(self) -> str:
        return self.settings.node

    def begin(self) -> None:
        """The first beat, before the node takes anything."""
        liveness.undrain(self.r, self.node)  # a node restarted after a drain takes work again
        self.tick()

    def start(self) -> None:
        self.thread = threading.Thread(target=self.loop, name="polar-heartbeat", daemon=True)
        self.thread.start()

    def loop(self) -> None:
        while not self.stopped.wait(self.settings.heartbeat_s):
            try:
                self.tick()
            except (redis.RedisError, OSError) as e:
                self.connected_since = None
                log.warning("polar node %s: heartbeat failed (%s); retrying", self.node, e)
            except Exception:  # noqa: BLE001 — the heartbeat must outlive any one bad tick
                log.exception("polar node %s: heartbeat tick failed", self.node)

    def tick(self) -> None:
        deadline = liveness.drain_deadline(self.r, self.node)
        held = self.prune()
        fields = {"state": liveness.DRAINING if deadline else liveness.ALIVE, "pid": os.getpid(),
                  "started_at": self.started_at, "load": len(held), "in_flight": [s for _, s in held],
                  "output_root": str(self.settings.output_root),  # `polar submit` without --out writes there
                  "proxies": proxy_statuses()}
        if not liveness.beat(self.r, self.node, self.settings.liveness_s, fields) and self.connected_since:
            log.warning("polar node %s: its heartbeat had lapsed; samples reassigned meanwhile are discarded here",
                        self.node)
        now = time.monotonic()
        self.connected_since = self.connected_since or now
        if self.settings.status_s and now - self.last_status >= self.settings.status_s:
            self.last_status = now
            say(status_line(self.node, fields["state"], held, time.time() - self.started_at, fields["proxies"]))
        if deadline is not None:
            self.drain_step(deadline, held)
        elif self.draining:  # undrained
            self.draining, self.handed_over = False, False
            self.consume_prepare(True)
        if now - self.connected_since >= self.settings.liveness_s:
            steps.reap(self.r, self.enqueue, me=self.node)

    def prune(self) -> list[tuple[str, str]]:
        """The samples this node still holds (entries that finished or moved on are dropped)."""
        held = []
        for batch_id, sample_id in liveness.held(self.r, self.node):
            state = batches.sample_state(self.r, batch_id, sample_id)
            if steps.holds(state, self.node):
                held.append((batch_id, sample_id))
            else:
                liveness.untrack(self.r, self.node, batch_id, sample_id)
        return held

    def drain_step(self, deadline: float, held: list[tuple[str, str]]) -> None:
        if not self.draining:
            self.draining = True
            self.consume_prepare(False)
            log.warning("polar node %s: draining; %d samples may finish until %s", self.node, len(held),
                        time.strftime("%H:%M:%S", time.localtime(deadline)))
        if held and time.time() >= deadline and not self.handed_over:
            self.handed_over = True
            tasks = {s: batches.sample_state(self.r, b, s) for b, s in held}
            moved = steps.hand_over(self.r, self.enqueue, self.node, "drained past its deadline")
            for sample_id in moved:  # their harnesses stop; what they would still write is stale
                if tasks[sample_id].get("stage") == "run" and tasks[sample_id].get("task"):
                    self.revoke(tasks[sample_id]["task"], terminate=True)
            held = []
        if self.terminating and not held:
            self.shutdown()

    def on_sigterm(self, previous: Any) -> Callable[[int, Any], None]:
        """A SIGTERM handler: the first drains, then shuts down as Celery does; a second shuts down at once."""
        def handler(signum: int, frame: Any) -> None:
            if not self.terminating:
                self.terminating = True
                threading.Thread(target=self.request_drain, daemon=True).start()  # no Redis I/O in a handler
            elif callable(previous):  # drained (the heartbeat signals us), or asked twice
                previous(signum, frame)
            else:
                raise SystemExit(0)

        return handler

    def request_drain(self) -> None:
        if liveness.drain_deadline(self.r, self.node) is None:
            liveness.drain(self.r, self.node, self.settings.drain_s)

    def shutdown(self) -> None:
        """Drained after a SIGTERM: signal ourselves again, which the handler passes on to Celery's warm shutdown
        (only the main thread may handle signals)."""
        if not self.stopped.is_set():
            self.stopped.set()
            os.kill(os.getpid(), signal.SIGTERM)

    def stop(self) -> None:
        """The worker is shutting down: hand over whatever is still held, then leave (no liveness wait)."""
        self.stopped.set()
        if self.thread is not None and self.thread is not threading.current_thread():
            self.thread.join(10)
        try:
            steps.hand_over(self.r, self.enqueue, self.node, "shut down")
            liveness.undrain(self.r, self.node)
            liveness.leave(self.r, self.node)
        except (redis.RedisError, OSError) as e:
            log.warning("polar node %s: could not hand over at shutdown (%s); it will be reaped as lost", self.node, e)
