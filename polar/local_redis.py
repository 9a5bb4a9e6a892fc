"""A private redis-server on a unix socket only (reachable from any network namespace), for a proxy whose
sessions must carry their task ids when no shared Redis is given (`polar run --task`)."""
from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from polar.services import ServiceError
from polar_mitm.launch import stop


@contextmanager
def private_redis(log_dir: Path, start_timeout_s: float = 20.0) -> Iterator[str]:
    """Yields `unix://…/redis.sock` (a short temporary directory: socket paths are limited); stops it after."""
    server = shutil.which("redis-server")
    if server is None:
        raise ServiceError("redis-server is not installed (make setup installs it)")
    tmp = Path(tempfile.mkdtemp(prefix="polar-redis-"))
    sock, log = tmp / "redis.sock", log_dir / "redis.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "wb") as out:
        proc = subprocess.Popen([server, "--port", "0", "--unixsocket", str(sock), "--unixsocketperm", "700",
                                 "--save", "", "--appendonly", "no", "--dir", str(tmp)],
                                stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + start_timeout_s
        while not sock.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise ServiceError(f"redis-server did not start: {log.read_text()[-1000:]}")
            time.sleep(0.05)
        yield f"unix://{sock}"
    finally:
        stop(proc)
        shutil.rmtree(tmp, ignore_errors=True)
