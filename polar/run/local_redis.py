"""A private redis-server for one run, stopped after it: on a unix socket only (reachable from any network
namespace: a proxy whose sessions must carry their task ids when no shared Redis is given, `polar run --task`)
or on 127.0.0.1 and a free port (Celery's broker in the demo, the benches and the tests). Persistence is on
(`appendonly yes`, as a cluster's Redis must have it): a redis-server restarted on the same data directory keeps
every queued stage and the batch state."""
from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from polar.run.services import ServiceError
from polar.sandbox import supervisor
from polar_mitm.launch import free_port, stop, wait_for_port


def redis_command(data_dir: Path, port: int = 0, sock: Path | None = None) -> list[str]:
    """redis-server on 127.0.0.1:`port` (or only the unix socket `sock`), its append-only file in `data_dir`."""
    server = shutil.which("redis-server")
    if server is None:
        raise ServiceError("redis-server is not installed (make setup installs it)")
    listen = ["--unixsocket", str(sock), "--unixsocketperm", "700"] if sock else ["--bind", "127.0.0.1"]
    return [server, "--port", str(port), *listen, "--save", "", "--appendonly", "yes", "--dir", str(data_dir)]


def start_redis(cmd: list[str], log: Path) -> subprocess.Popen:
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)


@contextmanager
def private_redis(log_dir: Path, start_timeout_s: float = 20.0, tcp: bool = False) -> Iterator[str]:
    """Yields `unix://…/redis.sock` (in a short temporary directory: socket paths are limited) or, with `tcp`,
    `redis://127.0.0.1:PORT/0`. Its data (the append-only file) goes with it."""
    tmp = Path(tempfile.mkdtemp(prefix="polar-redis-"))
    sock, log = tmp / "redis.sock", log_dir / "redis.log"
    port = free_port() if tcp else 0
    watches = [supervisor.watch_path(tmp)]  # its data holds the sessions' tokens: gone with a killed run too
    proc = start_redis(redis_command(tmp, port, None if tcp else sock), log)
    watches.append(supervisor.watch_process(proc.pid))
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
        for watch in watches:
            watch.release()
