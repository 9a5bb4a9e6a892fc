"""The engines a proxy is given, as plain values (no I/O, no aiohttp): their URLs (`polar_backend`), the
placement rule for new sessions (`polar_engine_placement`), and the Redis key of a session's placement. The
live replicas are in polar_mitm/engines/replicas.py."""
from __future__ import annotations

from urllib.parse import urlsplit

PLACEMENTS = ("least_loaded", "round_robin")
PLACEMENT_PREFIX = "polar:engine:"


def parse_backend(spec: str) -> str:
    parts = urlsplit(spec)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"expected http://host:port, got {spec!r}")
    return spec.rstrip("/")


def parse_backends(spec: str) -> tuple[str, ...]:
    """Engine URLs from `http://a:30000,http://b:30000` (one or more, no repeats)."""
    urls = tuple(parse_backend(part.strip()) for part in spec.split(",") if part.strip())
    if not urls:
        raise ValueError("give at least one engine URL (http://host:port, comma-separated for several)")
    if len(set(urls)) != len(urls):
        raise ValueError(f"an engine URL is listed twice in {spec!r}")
    return urls


def placement_key(task_id: str, session_id: str) -> str:
    return f"{PLACEMENT_PREFIX}{task_id}/{session_id}"  # ids never hold "/" (records.check_id)


def parse_placement(spec: str) -> str:
    if spec not in PLACEMENTS:
        raise ValueError(f"expected one of {PLACEMENTS}, got {spec!r}")
    return spec
