"""polar: the command line (polar.cli) and the single-machine side of Polar: run/, tasks/, scoring/, harness/,
sandbox/, report/; and the SDK, `from polar import PolarClient` (polar/client.py: over HTTP or a Redis broker,
loaded on first use so `polar` commands do not pay for httpx)."""
from __future__ import annotations

from typing import Any

__all__ = ["PolarClient"]


def __getattr__(name: str) -> Any:
    if name == "PolarClient":
        from polar.client import PolarClient

        return PolarClient
    raise AttributeError(f"module 'polar' has no attribute {name!r}")
