"""Polar's rollout service on Celery: `celery -A workers worker` on each node (see workers/celery_app.py).

`workers.app` is built on first access, from the environment (workers/settings.py), so the client and the CLI
can use the plain modules (batches, manifest, steps) without configuring a worker."""
from __future__ import annotations

from typing import Any

__all__ = ["app"]


def __getattr__(name: str) -> Any:
    if name == "app":
        from workers.celery_app import app

        return app
    raise AttributeError(f"module 'workers' has no attribute {name!r}")
