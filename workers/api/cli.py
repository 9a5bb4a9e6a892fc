"""`polar api`: the rollout service over HTTP, in front of the workers' Redis (docs/api.md)."""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from polar_serve.cli import port
from workers.settings import DEFAULT_BROKER

TOKEN_ENV = "POLAR_API_TOKEN"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("api", help="serve the rollout service over HTTP (tasks, status, trajectories, events, "
                                   "callbacks, a dashboard); bearer token from $POLAR_API_TOKEN",
                       description=__doc__)
    p.add_argument("--host", default="127.0.0.1", help="listen address (default: loopback only)")
    p.add_argument("--port", type=port, default=50051)
    p.add_argument("--broker", default=os.environ.get("POLAR_BROKER", DEFAULT_BROKER),
                   help="the workers' Redis (default $POLAR_BROKER or %(default)s)")
    p.add_argument("--sessions", default=os.environ.get("POLAR_SESSIONS"),
                   help="the proxies' sessions/fence Redis (default: db 0 beside the broker)")
    p.add_argument("--out", type=Path, default=Path(os.environ.get("POLAR_OUTPUT_ROOT", "runs/batches")),
                   help="batch folders, on storage every node sees")
    p.add_argument("--tasks-root", type=Path, default=Path(os.environ.get("POLAR_TASKS_ROOT") or Path.cwd()),
                   help="submitted tasks' workspace/tests paths must lie under this folder, relative ones are taken "
                        "from it (default $POLAR_TASKS_ROOT, else the working directory)")
    p.add_argument("--max-body", type=int, default=1 << 20, help="largest request body in bytes (413 beyond)")
    p.add_argument("--max-samples", type=int, default=4096, help="most samples in one batch (422 beyond)")
    p.add_argument("--heartbeat", type=float, default=15.0, help="seconds between SSE heartbeats on /events")
    p.add_argument("--callback-attempts", type=int, default=5,
                   help="tries per callback (waits 0.5, 1, 2, 4 … s between them) before it is recorded as failed")
    p.add_argument("--callback-host", action="append", default=[], metavar="HOST",
                   help="allow callbacks to this host name, address or CIDR network (repeat; also "
                        "$POLAR_CALLBACK_HOSTS, comma-separated); loopback is always allowed, private and "
                        "link-local addresses only when named here")
    p.add_argument("--max-streams", type=int, default=256,
                   help="most /events streams open at once in this process (429 beyond)")
    p.set_defaults(func=serve)


def redis_down(broker: str) -> str | None:
    """Why the workers' Redis does not answer (None when it does), asked once before the server starts."""
    import redis

    from workers import batches

    try:
        batches.connect(broker, retry_s=2.0).ping()
    except (redis.RedisError, OSError, ValueError) as e:
        return f"cannot reach the workers' Redis at {broker} ({' '.join(str(e).split())}): start it, or give --broker"
    return None


def serve(args: argparse.Namespace) -> int:
    import uvicorn

    from workers.api.app import create_app
    from workers.api.callback_policy import HOSTS_ENV, parse_hosts
    from workers.api.callbacks import RetryPolicy
    from workers.api.service import ApiConfig

    token = os.environ.get(TOKEN_ENV, "")
    if len(token) < 16:
        print(f"polar api: set {TOKEN_ENV} to a secret of 16 characters or more (every endpoint but /health "
              f"needs it as a bearer token)", file=sys.stderr)
        return 2
    for name, value in (("--max-body", args.max_body), ("--max-samples", args.max_samples),
                        ("--heartbeat", args.heartbeat), ("--callback-attempts", args.callback_attempts),
                        ("--max-streams", args.max_streams)):
        if value <= 0:
            print(f"polar api: {name}: expected more than 0, got {value}", file=sys.stderr)
            return 2
    hosts = (os.environ.get(HOSTS_ENV, ""), *args.callback_host)
    try:
        parse_hosts(hosts)
    except ValueError as e:
        print(f"polar api: --callback-host: {e}", file=sys.stderr)
        return 2
    config = ApiConfig(args.broker, args.out.resolve(), token, args.tasks_root.resolve(), args.sessions, args.host,
                       args.port, args.max_body, args.max_samples, args.heartbeat, callback_hosts=hosts,
                       max_streams=args.max_streams)
    retry = RetryPolicy(attempts=args.callback_attempts)
    if (down := redis_down(args.broker)) is not None:  # one line, not uvicorn's startup traceback
        print(f"polar api: {down}", file=sys.stderr)
        return 1
    # where batch folders go, said before anything is written there (the default is the current folder's)
    print(f"polar api: batches in {config.out} (--out), tasks read under {config.tasks_root} (--tasks-root)",
          file=sys.stderr, flush=True)
    uvicorn.run(create_app(config, retry), host=args.host, port=args.port, log_level="info",
                timeout_graceful_shutdown=3)
    return 0
