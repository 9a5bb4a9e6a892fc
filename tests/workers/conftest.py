"""Fixtures for workers/: a private redis-server (TCP on 127.0.0.1 inside the suite's network namespace)."""
from __future__ import annotations

from typing import Iterator

import pytest

from tests.redis_server import redis_server


@pytest.fixture(scope="module")
def redis_base(tmp_path_factory) -> Iterator[str]:
    """redis://127.0.0.1:PORT (append /DB)."""
    with redis_server(tmp_path_factory.mktemp("redis")) as url:
        yield url.rsplit("/", 1)[0]
