"""A real redis-server on 127.0.0.1 and a free port, for tests (the suite runs in its own network namespace)."""
from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from polar.run.local_redis import private_redis


@contextmanager
def redis_server(workdir: Path) -> Iterator[str]:
    """Yields redis://127.0.0.1:PORT/0; `make setup` installs Debian's redis-server."""
    with private_redis(workdir, tcp=True) as url:
        yield url
