"""The Celery app: `celery -A workers worker` starts a node (settings: workers/settings.py).

A node consumes the shared `prepare` and `postrun` queues and its own `<node>.run` and `<node>.postrun`; give a
worker `-Q` to size one stage's concurrency separately. Long tasks: prefetch 1, late acks on the idempotent
stages, a message whose worker process died is requeued (reject_on_worker_lost). No result backend: state lives
in Redis (workers/batches.py) and in the batch folder. Once ready, the node beats (workers/heartbeat.py): it is
listed alive, reassigns what lost nodes held, and drains on `polar node drain` or SIGTERM.
"""
from __future__ import annotations

import functools
import logging
import signal

from celery import Celery, signals
from kombu import Exchange, Queue

from workers import node
from workers.settings import PUBLISH_RETRY, load_settings

log = logging.getLogger(__name__)
BROKER_WAIT_S = 10.0  # how long a starting node retries its broker's and sessions' Redis before it refuses to start
ENGINE_WAIT_S = 30.0  # how long a starting node waits for its engine to answer before it refuses to start

try:
    settings = load_settings()
except ValueError as e:  # one clear line, not a traceback, and no worker
    raise SystemExit(f"polar worker: {e}") from None


def queue(name: str) -> Queue:
    return Queue(name, Exchange(name, type="direct"), routing_key=name)


app = Celery("workers", broker=settings.broker, include=["workers.stage_tasks", "workers.group_tasks"])
app.conf.update(
    # Finishing a sample beats starting one: queues are polled in this order (priority strategy below), so a node
    # does not prepare sandboxes faster than it runs them.
    task_queues=[queue(name) for name in (f"{settings.node}.postrun", f"{settings.node}.run", "postrun", "prepare")],
    task_default_queue="prepare",
    task_ignore_result=True,
    task_serializer="json",
    accept_content=["json"],
    worker_prefetch_multiplier=1,
    broker_connection_retry_on_startup=True,
    # An unacked message goes back to its queue after this long; longer than any sample may run.
    broker_transport_options={"visibility_timeout": 6 * 3600, "queue_order_strategy": "priority"},
    # No Celery task events: nothing of Polar reads them (its own stream is workers/events.py), and each stage
    # paid for four. For Flower or `celery events`: `celery -A workers control enable_events`.
    worker_send_task_events=False,
    task_send_sent_event=False,
    # Sending the next stage rides out a Redis restart instead of failing the stage.
    task_publish_retry_policy=PUBLISH_RETRY,
)


_heartbeat = None


@signals.worker_init.connect
def _start_node(**_: object) -> None:
    """Model dir, engine, proxy, then a first heartbeat: the node is listed alive before it takes any sample,
    and a node that cannot serve one refuses to start (one line, exit 1) before its consumer takes any."""
    global _heartbeat
    from polar.run.services import ServiceError
    from workers import batches, steps
    from workers.announce import engines_when_up, say, startup_line
    from workers.api.callback_policy import redact
    from workers.heartbeat import Heartbeat

    try:
        for what, url in (("POLAR_BROKER", settings.broker), ("POLAR_SESSIONS", settings.sessions)):
            if (why := batches.unreachable(url, BROKER_WAIT_S)) is not None:
                raise RuntimeError(f"{what} {redact(url)}: not answering ({why})")  # no password in the line
        if (problem := node.model_problem(settings.model_dir)) is not None:
            raise RuntimeError(problem)
        engines, warnings = engines_when_up(settings, ENGINE_WAIT_S)
        proxies = node.start(settings)
    except (ServiceError, RuntimeError, OSError, ValueError) as e:
        node.stop()
        say(f"polar node {settings.node}: refused to start: {' '.join(str(e).split())[:600]}")
        raise SystemExit(1) from None
    say(startup_line(settings, proxies, [q.name for q in app.conf.task_queues],
                     [node.log_path(settings, k) for k in range(len(proxies))], engines))
    for warning in warnings:
        say(f"polar node {settings.node}: warning: {warning}")
    messages = steps.Messages(app)
    _heartbeat = Heartbeat(settings, batches.connect(settings.broker), messages.enqueue, messages.revoke)
    _heartbeat.begin()


@functools.lru_cache(maxsize=64)
def _batch_id(manifest_path: str) -> str:
    from workers.manifest import read_manifest

    return read_manifest(manifest_path).batch_id


@signals.task_received.connect
def _received(request=None, **_: object) -> None:
    """A prepare message this node took (to run now, or prefetched): the node holds its sample from now on, so
    the sample is reassigned if the node is lost before the stage starts (workers/steps.py reserve)."""
    import redis

    from workers import steps

    if request is None or _heartbeat is None or request.name != steps.PREPARE or len(request.args or ()) < 2:
        return
    manifest_path, sample_id = request.args[:2]
    try:
        steps.reserve(_heartbeat.r, settings.node, _batch_id(manifest_path), sample_id, request.id)
    except (OSError, ValueError, KeyError, redis.RedisError) as e:  # the stage itself still runs
        log.warning("polar node %s: could not record sample %s as reserved here (%s)", settings.node, sample_id, e)


@signals.worker_ready.connect
def _start_heartbeat(sender=None, **_: object) -> None:
    """The heartbeat thread starts once the pool has forked (its processes need no copy of it)."""
    hostname = sender.hostname

    def consume_prepare(on: bool) -> None:
        if on:
            app.control.add_consumer("prepare", exchange="prepare", routing_key="prepare", destination=[hostname])
        else:
            app.control.cancel_consumer("prepare", destination=[hostname])

    if _heartbeat is not None:
        _heartbeat.consume_prepare = consume_prepare
        _heartbeat.start()
        signal.signal(signal.SIGTERM, _heartbeat.on_sigterm(signal.getsignal(signal.SIGTERM)))


@signals.worker_shutdown.connect
def _stop_node(**_: object) -> None:
    if _heartbeat is not None:
        _heartbeat.stop()
    node.stop()


@signals.task_revoked.connect
def _revoked(request=None, terminated: bool = False, **_: object) -> None:
    """A stage killed by a revoke before it could clean up: its sample is cancelled."""
    if request is None or not terminated or len(request.args or ()) < 2:
        return
    from workers import batches
    from workers.manifest import read_manifest

    manifest_path, sample_id = request.args[:2]
    try:
        r = batches.connect(settings.broker)
        batch_id = read_manifest(manifest_path).batch_id
        if batches.sample_state(r, batch_id, sample_id).get("task") == request.id:
            batches.update_sample(r, batch_id, sample_id, stage="cancelled")
    except (OSError, ValueError, KeyError):
        pass
