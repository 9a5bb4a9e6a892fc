"""The SDK over HTTP lives in polar/client.py (it needs nothing of workers/); the names stay importable from here,
where workers/client.py hands its http(s) URLs."""
from __future__ import annotations

from polar.client import ApiError, HttpBatch, HttpClient, PolarClient  # noqa: F401 (re-exported)
