"""A private redis-server for one run, stopped after it: on a unix socket only (reachable from any network
namespace: a proxy whose sessions must carry their task ids when no shared Redis is given, `polar run --task`)
or on 127.0.0.1 and a free port (Celery's broker in the demo, the benches and the tests)."""
from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from polar.run.services import ServiceError
from polar_mitm.launch import free_port, stop, wait_for_port


@contextmanager
def private_redis(log_dir: Path, start_timeout_s: float = 20.0, tcp: bool = False) -> Iterator[str]:
    """Yields `unix://…/redis.sock` (in a short temporary directory: socket paths are limited) or, with `tcp`,
    `redis://127.0.0.1:PORT/0`. Nothing is saved to disk."""
    server = shutil.which("redis-server")
    if server is None:
        raise ServiceError("redis-server is not installed (make setup installs it)")
    tmp = Path(tempfile.mkdtemp(prefix="polar-redis-"))
    sock, log = tmp / "redis.sock", log_dir / "redis.log"
    port = free_port() if tcp else 0
    listen = ["--bind", "127.0.0.1"] if tcp else ["--unixsocket", str(sock), "--unixsocketperm", "700"]
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "wb") as out:
        proc = subprocess.Popen([server, "--port", str(port), *listen, "--save", "", "--appendonly", "no",
                                 "--dir", str(tmp)], stdout=out, stderr=subprocess.STDOUT)
    try:
        if tcp:
            try:
                wait_for_port(port, proc, log, start_timeout_s, "127.0.0.1")
            except RuntimeError as e:
                raise ServiceError(f"redis-server did not start: {e}") from e
            yield f"redis://127.0.0.1:{port}/0"
            return
        deadline = time.monotonic() + start_timeout_s
        while not sock.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise ServiceError(f"redis-server did not start: {log.read_text()[-1000:]}")
            time.sleep(0.05)
        yield f"unix://{sock}"
    finally:
        stop(proc)
        shutil.rmtree(tmp, ignore_errors=True)
