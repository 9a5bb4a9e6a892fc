"""`python -m polar.rollout_server --port 50051`: the rollout service over HTTP, the same server as `polar api`
with every option of it (docs/api.md), bearer token from $POLAR_API_TOKEN. With no --broker and no $POLAR_BROKER
it starts a private Redis on 127.0.0.1 for its own life, as `polar run` does, so one command serves one machine;
nodes join it with `python -m polar.gateway --rollout_server HOST:PORT …`, which asks it for the broker."""
from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

from polar.run.local_redis import private_redis
from polar.run.services import ServiceError

PROG = "python -m polar.rollout_server"


def option(argv: list[str], name: str) -> str | None:
    """The value of `--name VALUE` or `--name=VALUE` in argv (the last one wins, as argparse's)."""
    found = None
    for i, arg in enumerate(argv):
        if arg == name and i + 1 < len(argv):
            found = argv[i + 1]
        elif arg.startswith(name + "="):
            found = arg.split("=", 1)[1]
    return found


def needs_private_redis(argv: list[str], env: dict[str, str]) -> bool:
    """No broker given, and the server would start (help and a missing token say their line without one)."""
    if option(argv, "--broker") or env.get("POLAR_BROKER") or {"-h", "--help"} & set(argv):
        return False
    return len(env.get("POLAR_API_TOKEN", "")) >= 16


def main(argv: list[str] | None = None) -> int:
    from polar.cli import main as polar_main  # `polar api`'s own parser and server

    argv = list(sys.argv[1:] if argv is None else argv)
    if not needs_private_redis(argv, dict(os.environ)):
        return polar_main(["api", *argv])
    out = Path(option(argv, "--out") or os.environ.get("POLAR_OUTPUT_ROOT", "runs/batches"))
    # A plain `kill`: uvicorn shuts down, then raises SIGTERM again; as SystemExit it unwinds past the private
    # Redis, which stops with the server instead of staying behind (Ctrl-C already did).
    signal.signal(signal.SIGTERM, _exit_on_term)
    try:
        with private_redis(out / "services", tcp=True) as url:
            broker = url.rsplit("/", 1)[0] + "/1"  # db 1 for the broker, db 0 for sessions, as a cluster's Redis
            print(f"{PROG}: no --broker or $POLAR_BROKER: a private Redis at {broker} while this server runs "
                  f"(nodes on this machine learn it from GET /api/node-config)", file=sys.stderr, flush=True)
            return polar_main(["api", "--broker", broker, *argv])
    except ServiceError as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 2


def _exit_on_term(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


if __name__ == "__main__":
    sys.exit(main())
