"""`python -m polar.gateway --rollout_server HOST:PORT --inference_server HOST:PORT [--model DIR]`: one worker node,
the same process as `celery -A workers worker` (docs/scaling.md), set up from the rollout
server instead of the environment: it asks `GET /api/node-config` (bearer $POLAR_API_TOKEN) for the broker, the
sessions Redis and the output root, takes the model directory from --model or from the engine's own
/get_model_info when that names a directory here, then becomes the Celery worker (exec), which starts the node's
proxy and registers the node with its heartbeat (listed by `polar nodes` and the server's /rollout/status)."""
from __future__ import annotations

import argparse
import ipaddress
import json
import os
import sys
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit

PROG = "python -m polar.gateway"
ROOT = Path(__file__).resolve().parents[1]
TOKEN_ENV = "POLAR_API_TOKEN"


class GatewayError(RuntimeError):
    """One line for the user; the node does not start."""


def http_url(address: str) -> str:
    return (address if "://" in address else f"http://{address}").rstrip("/")


def get_json(url: str, token: str | None = None, timeout_s: float = 10.0) -> dict:
    headers = {"authorization": f"Bearer {token}"} if token else {}
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never through the user's HTTP_PROXY
    with opener.open(urllib.request.Request(url, headers=headers), timeout=timeout_s) as reply:
        return json.loads(reply.read(1 << 20))


def node_config(server: str, token: str) -> dict:
    url = f"{server}/api/node-config"
    try:
        config = get_json(url, token)
    except urllib.error.HTTPError as e:
        why = f"${TOKEN_ENV} was refused" if e.code == 401 else f"HTTP {e.code}"
        raise GatewayError(f"--rollout_server {server}: {why} ({url})") from None
    except (OSError, ValueError) as e:
        raise GatewayError(f"--rollout_server {server}: no answer from {url} ({getattr(e, 'reason', e)})") from None
    missing = [k for k in ("broker", "sessions", "output_root") if not config.get(k)]
    if missing:
        raise GatewayError(f"--rollout_server {server}: its node-config lacks {', '.join(missing)} (an older server?)")
    return config


def is_loopback(host: str | None) -> bool:
    if host in (None, "", "localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_reachable(server: str, broker: str) -> None:
    """A broker on the server's own loopback (its private Redis) is reachable only from the server's machine."""
    if broker.startswith("redis") and is_loopback(urlsplit(broker).hostname) and not is_loopback(
            urlsplit(server).hostname):
        raise GatewayError(f"--rollout_server {server}: its broker {broker} is on that machine's loopback; start "
                           f"the server with --broker redis://HOST:6379/1 that this node reaches")


def model_dir(given: Path | None, engines: list[str]) -> Path:
    """--model, else the directory the first engine says it loaded, when it is one on this machine."""
    if given is not None:
        if not given.is_dir():
            raise GatewayError(f"--model {given}: no such directory (the tokenizer and chat template of the model "
                               f"the engine serves)")
        return given.resolve()
    try:
        path = get_json(f"{engines[0]}/get_model_info", timeout_s=5.0).get("model_path") or ""
    except (OSError, ValueError):
        path = ""
    if path and Path(path).is_dir():
        return Path(path).resolve()
    seen = f"it names {path!r}" if path else "it names no model directory"
    raise GatewayError(f"--model DIR needed: the tokenizer and chat template of the model {engines[0]} serves "
                       f"({seen}, not a directory here)")


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="Arguments after -- go to the Celery worker (e.g. -- -Q prepare).")
    p.add_argument("--rollout_server", "--rollout-server", required=True, metavar="HOST:PORT",
                   help="the rollout server (python -m polar.rollout_server, polar api)")
    p.add_argument("--inference_server", "--inference-server", required=True, metavar="HOST:PORT[,HOST:PORT]",
                   help="the engine (SGLang, vLLM or polar serve); several replicas comma-separated")
    p.add_argument("--model", type=Path, help="its tokenizer + chat template (default: the engine's model_path)")
    p.add_argument("--engine", choices=("sglang", "vllm"), help="its token API (default $POLAR_ENGINE or sglang)")
    p.add_argument("--node", help="this node's name (default $POLAR_NODE or the host name)")
    p.add_argument("-c", "--concurrency", type=int, help="samples at once (Celery's -c; default the CPU count)")
    cut = argv.index("--") if "--" in argv else len(argv)
    return p.parse_args(argv[:cut]), argv[cut + 1:]


def worker_env(args: argparse.Namespace, env: dict[str, str]) -> dict[str, str]:
    token = env.get(TOKEN_ENV, "")
    if not token:
        raise GatewayError(f"set ${TOKEN_ENV} to the rollout server's token (it serves the node's settings "
                           f"only to a bearer of it)")
    server = http_url(args.rollout_server)
    config = node_config(server, token)
    check_reachable(server, config["broker"])
    engines = [http_url(a) for a in args.inference_server.split(",") if a.strip()]
    named = {"POLAR_ENGINE": args.engine, "POLAR_NODE": args.node}
    return {**env, **{k: v for k, v in named.items() if v},
            "POLAR_BROKER": config["broker"], "POLAR_SESSIONS": config["sessions"],
            "POLAR_OUTPUT_ROOT": config["output_root"], "POLAR_ENGINE_URL": ",".join(engines),
            "POLAR_MODEL_DIR": str(model_dir(args.model, engines)),
            "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)}


def main(argv: list[str] | None = None) -> int:
    args, extra = parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        env = worker_env(args, dict(os.environ))
    except GatewayError as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 2
    cmd = [sys.executable, "-m", "celery", "-A", "workers", "worker", *(["-c", str(args.concurrency)] if args.concurrency else []), *extra]
    print(f"{PROG}: joining {http_url(args.rollout_server)}: broker {env['POLAR_BROKER']}, output "
          f"{env['POLAR_OUTPUT_ROOT']}, engines {env['POLAR_ENGINE_URL']}, model {env['POLAR_MODEL_DIR']}; "
          f"as `celery -A workers worker` from here", file=sys.stderr, flush=True)
    os.execvpe(cmd[0], cmd, env)
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
