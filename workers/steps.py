"""What each stage does around the single-sample code: bookkeeping in Redis, cancel checks, the next stage's
message, infrastructure retries, group completion and early stop. Plain functions: the Celery tasks pass in
`enqueue` and `revoke`, tests can call them directly.

Routing: prepare runs on any node (queue `prepare`); the node that prepared a sample holds its sandbox, so its
run and postrun go to that node's own queues (`<node>.run`, `<node>.postrun`); a group's advantages are
written by any node (queue `postrun`).

Stale messages: every write a stage makes is a compare-and-set on the sample's current task id. When a node is lost
(its heartbeat expired, workers/liveness.py) whoever notices first reassigns its samples (`reap`): a new task id,
a new prepare on any node. A node holds the samples whose stages it runs and the queued ones whose prepare message
it has received (prefetched, or waiting out a retry's countdown: `reserve`), so none waits on a node that is gone.
What the lost node still had queued, or still runs if it comes back, no longer matches: it raises Stale and is
discarded, so a reassigned sample is never finished twice.
"""
from __future__ import annotations

import functools
import logging
import time
import uuid
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Callable, TypeVar

import redis

from polar_traj.outcomes import is_masked
from workers import batches, liveness, sample_flow as flow
from workers.groups import GroupConfig, write_group
from workers.manifest import Manifest, read_manifest, result_path, sample_dir, write_json

Enqueue = Callable[..., None]  # enqueue(task_name, args, queue=…, task_id=…, countdown=…)
Revoke = Callable[..., None]  # revoke(task_id, terminate=bool)
HELD = ("prepare", "run", "evaluate", "postrun")  # stages whose sample is held by its node
QUEUED = ("queued", "retry")  # stages whose prepare message waits in the queue or in a node's prefetch
log = logging.getLogger(__name__)
F = TypeVar("F", bound=Callable[..., None])


class Stale(Exception):
    """This stage's task is no longer its sample's: the sample was reassigned (or handed over) meanwhile."""


def discard_stale(fn: F) -> F:
    @functools.wraps(fn)
    def wrapper(step: "Step", *args: Any) -> None:
        try:
            fn(step, *args)
        except Stale:
            log.warning("polar: discarded a stale %s of sample %s (task %s): it was reassigned", fn.__name__,
                        step.sample_id, step.task_id)
    return wrapper  # type: ignore[return-value]


@dataclass(frozen=True)
class Messages:
    """`enqueue` and `revoke` over a Celery app: the worker's own, or the client's (which only sends)."""

    app: Any

    def enqueue(self, name: str, args: list, queue: str, task_id: str, countdown: float = 0) -> None:
        self.app.send_task(name, args=args, queue=queue, task_id=task_id, countdown=countdown or None)

    def revoke(self, task_id: str, terminate: bool = False) -> None:
        self.app.control.revoke(task_id, terminate=terminate, signal="SIGTERM")

PREPARE, RUN, POSTRUN, GROUP = ("workers.stage_tasks.prepare", "workers.stage_tasks.run",
                                "workers.stage_tasks.postrun", "workers.group_tasks.finish_group")


@dataclass(frozen=True)
class Step:
    manifest_path: str
    sample_id: str
    ctx: flow.NodeContext
    r: redis.Redis
    task_id: str
    enqueue: Enqueue

    @cached_property
    def manifest(self) -> Manifest:
        return read_manifest(self.manifest_path)

    @property
    def batch_id(self) -> str:
        return self.manifest.batch_id

    @property
    def node(self) -> str:
        return self.ctx.settings.node

    def state(self) -> dict[str, Any]:
        return batches.sample_state(self.r, self.batch_id, self.sample_id)

    def update(self, **fields: Any) -> None:
        """Write the sample's state while this stage's task is still its current one; Stale otherwise."""
        if batches.update_sample(self.r, self.batch_id, self.sample_id, if_task=self.task_id, **fields) is None:
            raise Stale(self.sample_id)

    def check(self) -> None:
        if self.state().get("task") != self.task_id:
            raise Stale(self.sample_id)

    def active(self) -> bool:
        return batches.status(self.r, self.batch_id) == batches.RUNNING

    def next(self, name: str, queue: str, *args: Any, countdown: float = 0, stage: str, **fields: Any) -> None:
        task_id = str(uuid.uuid4())
        self.update(stage=stage, task=task_id, reserved_by=None, **fields)
        self.enqueue(name, [self.manifest_path, self.sample_id, *args], queue=queue, task_id=task_id,
                     countdown=countdown)


def holds(state: dict[str, Any], node: str) -> bool:
    """Whether `node` holds a sample: it runs one of its stages, or it has received its queued prepare message
    (prefetched, or waiting out a retry's countdown), which no other node can take while it is alive."""
    if not state.get("task"):
        return False
    stage = state.get("stage")
    return (state.get("node") == node and stage in HELD) or (state.get("reserved_by") == node and stage in QUEUED)


def reserve(r: redis.Redis, node: str, batch_id: str, sample_id: str, task_id: str) -> None:
    """`node` received the sample's prepare message `task_id`: it holds the sample until that stage starts, so a
    node lost with messages in its prefetch has them reassigned like its running samples."""
    state = batches.sample_state(r, batch_id, sample_id)
    if state.get("task") == task_id and state.get("stage") in QUEUED:
        if batches.update_sample(r, batch_id, sample_id, if_task=task_id, reserved_by=node) is not None:
            liveness.track(r, node, batch_id, sample_id)


def submit_sample(enqueue: Enqueue, r: redis.Redis, manifest: Manifest, manifest_path: str, sample_id: str) -> None:
    task_id = str(uuid.uuid4())
    batches.update_sample(r, manifest.batch_id, sample_id, stage="queued", task=task_id)
    enqueue(PREPARE, [manifest_path, sample_id], queue="prepare", task_id=task_id, countdown=0)


@discard_stale
def prepare(step: Step) -> None:
    step.check()  # first: a stale message touches nothing, not even its old attempt
    if not step.active():
        return step.update(stage="cancelled")
    if liveness.drain_deadline(step.r, step.node) is not None:  # draining: another node takes it
        return step.next(PREPARE, "prepare", stage="queued")
    state = step.state()
    why = flow.SUPERSEDED
    if state.get("lost_from"):
        why = (f"node {state['lost_from']} {state.get('lost_reason', 'lost')}; the sample starts over", "node_lost")
    step.update(stage="prepare", node=step.node, task=step.task_id, lost_from=None, reserved_by=None)
    liveness.track(step.r, step.node, step.batch_id, step.sample_id)
    if state.get("reassigned", 0) > step.ctx.settings.infra_retries:
        flow.abandon_open(sample_dir(step.manifest, step.sample_id), step.ctx.proxy, why)
        return mask(step, f"its node was lost {state['reassigned']} times "
                          f"({', '.join(state.get('reassigned_from', []))}); POLAR_INFRA_RETRIES is "
                          f"{step.ctx.settings.infra_retries}")
    attempt = flow.prepare(step.manifest, step.sample_id, step.ctx, why)
    if not step.active():
        flow.stop(attempt)
        return step.update(stage="cancelled")
    step.update(attempt=attempt.name)
    step.next(RUN, f"{step.ctx.settings.node}.run", attempt.name, stage="run")


@discard_stale
def run(step: Step, attempt_name: str) -> None:
    step.check()
    attempt = sample_dir(step.manifest, step.sample_id) / attempt_name
    if not step.active():
        flow.stop(attempt)
        return step.update(stage="cancelled")
    step.update(stage="run", task=step.task_id)
    try:
        started = flow.run(attempt, step.ctx.settings.node)
    except flow.Cancelled:
        flow.stop(attempt)
        return step.update(stage="cancelled")  # Stale when a drain handed it over and then stopped it
    if not started:  # redelivered: the first run's worker died under it
        flow.abandon(attempt, step.ctx.proxy, "worker lost while the harness ran; the sample starts over",
                     "worker_lost")
        step.update(redelivered=batches.sample_state(step.r, step.batch_id, step.sample_id).get("redelivered", 0) + 1)
        return step.next(PREPARE, "prepare", stage="queued")
    step.next(POSTRUN, f"{step.ctx.settings.node}.postrun", attempt_name, stage="postrun")


@discard_stale
def postrun(step: Step, attempt_name: str) -> None:
    manifest = step.manifest
    sdir = sample_dir(manifest, step.sample_id)
    attempt = sdir / attempt_name
    step.check()
    if not step.active():
        flow.stop(attempt)
        return step.update(stage="cancelled")
    step.update(stage="postrun", task=step.task_id)
    result = flow.postrun(attempt)
    failures = flow.infra_failures(sdir)
    if result.failure == "infrastructure" and failures < step.ctx.settings.infra_retries:
        flow.abandon(attempt, step.ctx.proxy, f"infrastructure: {result.reason}", "infrastructure")
        step.update(retries=failures + 1, reason=result.reason)
        return step.next(PREPARE, "prepare", countdown=2.0 ** failures, stage="retry")
    finalize(step, result.to_dict())


def finalize(step: Step, data: dict[str, Any]) -> None:
    """Store the sample's final result; the last of its group to finish queues the group's advantages."""
    manifest = step.manifest
    step.check()  # a stale stage writes no result
    data["attempts"] = len(flow.attempts(sample_dir(manifest, step.sample_id)))
    data["node"] = step.ctx.settings.node
    data["reassigned_from"] = step.state().get("reassigned_from") or []
    settings = step.ctx.settings  # what served the sample's calls: the report names it
    data["engine"], data["model"] = f"{settings.engine} at {settings.engine_url}", str(settings.model_dir)
    write_json(result_path(manifest, step.sample_id), data)
    masked = is_masked(data.get("status"), data.get("failure"))
    step.update(stage="masked" if masked else "done", status=data.get("status"), failure=data.get("failure"),
                reward=data.get("reward"), reason=data.get("reason"), attempts=data["attempts"])
    liveness.untrack(step.r, step.node, step.batch_id, step.sample_id)
    group_id = manifest.sample(step.sample_id).group_id
    if batches.mark_final(step.r, manifest.batch_id, group_id, step.sample_id) >= len(manifest.group(group_id)):
        step.enqueue(GROUP, [step.manifest_path, group_id], queue="postrun", task_id=str(uuid.uuid4()), countdown=0)


@discard_stale
def fail(step: Step, stage: str, error: BaseException) -> None:
    """A stage that failed for good (an unexpected error, or retries spent): the sample is masked with the
    reason, so its group still completes."""
    if not step.active():
        return step.update(stage="cancelled")
    mask(step, f"{stage} stage: {type(error).__name__}: {error}")


def mask(step: Step, reason: str) -> None:
    entry = step.manifest.sample(step.sample_id)
    finalize(step, {"sample_id": step.sample_id, "task_id": entry.task_id, "group_id": entry.group_id,
                    "status": "error", "failure": "infrastructure", "reward": None, "weight": 0.0,
                    "reason": reason, "trajectories": None, "node": step.ctx.settings.node})


def finish_group(manifest_path: str, group_id: str, r: redis.Redis, revoke: Revoke, node: str | None = None) -> None:
    """Write the group's advantages; complete the batch when every group (or `min_groups`) is in. `node` holds the
    write meanwhile (queued again elsewhere if that node is lost)."""
    import json

    manifest = read_manifest(manifest_path)
    if batches.status(r, manifest.batch_id) == batches.CANCELLED:
        return
    if node:
        liveness.track(r, node, manifest.batch_id, group_id, "groups")
    results = [json.loads(result_path(manifest, s.sample_id).read_text()) for s in manifest.group(group_id)]
    write_group(manifest.batch_dir, group_id, results, GroupConfig(max_staleness=manifest.max_staleness))
    done = batches.mark_group_done(r, manifest.batch_id, group_id)
    if node:
        liveness.untrack(r, node, manifest.batch_id, group_id, "groups")
    if done >= len(manifest.groups):
        if batches.set_status(r, manifest.batch_id, batches.COMPLETED):
            write_outcome(r, manifest.batch_id)
    elif manifest.min_groups and done >= manifest.min_groups:
        stop_batch(r, revoke, manifest.batch_id, batches.COMPLETED)


def write_outcome(r: redis.Redis, batch_id: str) -> None:
    """outcome.json beside batch.json once the batch has its final status (completed, cancelled, stopped early),
    so the folder alone says how it ended: the report counts the samples that never finished as cancelled."""
    p = batches.progress(r, batch_id)
    folder = Path(batches.info(r, batch_id)["manifest"]).parent
    write_json(folder / "outcome.json", {"batch_id": batch_id, "ended_at": time.time(), **p.to_dict()})


def stop_batch(r: redis.Redis, revoke: Revoke, batch_id: str, final: str = batches.CANCELLED) -> bool:
    """Cancel (or early-stop) a batch: queued samples never start, running harnesses get SIGTERM and stop their
    sandboxes, stages in between see the status and clean up. False when the batch had already finished."""
    if not batches.set_status(r, batch_id, final):
        return False
    write_outcome(r, batch_id)
    for sample_id, state in batches.samples(r, batch_id).items():
        stage, task = state.get("stage", "queued"), state.get("task")
        if stage in ("queued", "retry"):
            batches.update_sample(r, batch_id, sample_id, stage="cancelled")
            if task:
                revoke(task, terminate=False)
        elif stage == "run" and task:
            revoke(task, terminate=True)
    return True


def reassign(r: redis.Redis, enqueue: Enqueue, node: str, batch_id: str, sample_id: str, why: str) -> bool:
    """Start a sample held by `node` again as a new attempt on any node; True for the one caller that claimed it
    (a compare-and-set on its task id). The old attempt is abandoned by the node that prepares the new one."""
    state = batches.sample_state(r, batch_id, sample_id)
    if not holds(state, node):
        liveness.untrack(r, node, batch_id, sample_id)  # finished, or already moved on
        return False
    running = batches.status(r, batch_id) == batches.RUNNING
    task_id = str(uuid.uuid4())
    claimed = batches.update_sample(
        r, batch_id, sample_id, if_task=state["task"], stage="queued" if running else "cancelled", task=task_id,
        reserved_by=None, lost_from=node, lost_reason=why, reassigned=state.get("reassigned", 0) + 1,
        reassigned_from=[*(state.get("reassigned_from") or []), node], reassigned_at=time.time())
    liveness.untrack(r, node, batch_id, sample_id)
    if claimed is None:
        return False
    if running:
        manifest_path = batches.info(r, batch_id)["manifest"]
        enqueue(PREPARE, [manifest_path, sample_id], queue="prepare", task_id=task_id, countdown=0)
    log.warning("polar: sample %s of batch %s reassigned from node %s (%s)", sample_id, batch_id, node, why)
    return True


def hand_over(r: redis.Redis, enqueue: Enqueue, node: str, why: str) -> list[str]:
    """Reassign every sample `node` holds, and queue again the group writes it had taken; the samples moved."""
    moved = [s for b, s in liveness.held(r, node) if reassign(r, enqueue, node, b, s, why)]
    for batch_id, group_id in liveness.held(r, node, "groups"):
        if liveness.untrack(r, node, batch_id, group_id, "groups") and group_id not in batches.groups_done(
                r, batch_id) and batches.status(r, batch_id) == batches.RUNNING:
            enqueue(GROUP, [batches.info(r, batch_id)["manifest"], group_id], queue="postrun",
                    task_id=str(uuid.uuid4()), countdown=0)
    return moved


def reap(r: redis.Redis, enqueue: Enqueue, me: str | None = None) -> list[str]:
    """Hand over what every node without a heartbeat still holds (by a node, the client or the CLI, whoever
    comes first: each sample is claimed once); returns the samples reassigned."""
    moved: list[str] = []
    for node in liveness.silent_nodes(r):
        if node != me:
            moved += hand_over(r, enqueue, node, "lost (no heartbeat)")
    return moved
