"""A sample's stages as Celery tasks: thin wrappers taking the batch manifest's path and ids (workers/steps.py).

Every stage is idempotent (a redelivered prepare or run starts a fresh attempt; postrun rewrites the same files
whole), so all three ack late and are requeued when their worker process dies. Expected infrastructure errors
(Redis or a service briefly unreachable) are retried twice with backoff.
"""
from __future__ import annotations

import logging

import redis
from celery import Task

from polar.run.services import ServiceError
from workers import batches, node, steps
from workers.celery_app import app, settings
from workers.sample_flow import NodeContext

log = logging.getLogger(__name__)


class StageTask(Task):
    """A stage that failed for good masks its sample (with the reason) instead of leaving it hanging."""

    def on_failure(self, exc, task_id, args, kwargs, einfo) -> None:
        try:
            steps.fail(_step(self, args[0], args[1]), self.name.rsplit(".", 1)[-1], exc)
        except Exception:  # noqa: BLE001 — the worker log is the last place to say it
            log.exception("polar: could not record the failure of %s for sample %s", self.name, args[1:2])


STAGE = dict(base=StageTask, bind=True, acks_late=True, reject_on_worker_lost=True,
             autoretry_for=(ServiceError, redis.ConnectionError, redis.TimeoutError),
             retry_backoff=2, retry_backoff_max=30, max_retries=2)


messages = steps.Messages(app)


def _step(task, manifest_path: str, sample_id: str) -> steps.Step:
    ctx = NodeContext(settings, node.for_sample(sample_id))
    return steps.Step(manifest_path, sample_id, ctx, batches.shared(settings.broker), task.request.id,
                      messages.enqueue)


@app.task(**STAGE)
def prepare(self, manifest_path: str, sample_id: str) -> None:
    steps.prepare(_step(self, manifest_path, sample_id))


@app.task(**STAGE)
def run(self, manifest_path: str, sample_id: str, attempt: str) -> None:
    steps.run(_step(self, manifest_path, sample_id), attempt)


@app.task(**STAGE)
def postrun(self, manifest_path: str, sample_id: str, attempt: str) -> None:
    steps.postrun(_step(self, manifest_path, sample_id), attempt)
