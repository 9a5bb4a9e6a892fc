"""A finished group's advantages (and the batch's completion or early stop) as a Celery task."""
from __future__ import annotations

import redis

from workers import batches, steps
from workers.celery_app import app, settings


messages = steps.Messages(app)


@app.task(acks_late=True, reject_on_worker_lost=True, autoretry_for=(redis.ConnectionError, redis.TimeoutError),
          retry_backoff=2, max_retries=2)
def finish_group(manifest_path: str, group_id: str) -> None:
    steps.finish_group(manifest_path, group_id, batches.shared(settings.broker), messages.revoke, settings.node)
