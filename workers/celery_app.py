"""The Celery app: `celery -A workers worker` starts a node (settings: workers/settings.py).

A node consumes the shared `prepare` and `postrun` queues and its own `<node>.run` and `<node>.postrun`; give a
worker `-Q` to size one stage's concurrency separately. Long tasks: prefetch 1, late acks on the idempotent
stages, a message whose worker process died is requeued (reject_on_worker_lost). No result backend: state lives
in Redis (workers/batches.py) and in the batch folder.
"""
from __future__ import annotations

from celery import Celery, signals
from kombu import Exchange, Queue

from workers import node
from workers.settings import load_settings

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
    worker_send_task_events=True,
    task_send_sent_event=True,
)


@signals.worker_init.connect
def _start_node(**_: object) -> None:
    node.start(settings)


@signals.worker_shutdown.connect
def _stop_node(**_: object) -> None:
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
