"""Worker configuration from the environment, with local defaults (one frozen value; nothing else reads os.environ).

  POLAR_BROKER        Celery broker + batch bookkeeping   redis://127.0.0.1:6379/1
  POLAR_SESSIONS      sessions + weight-sync fence        the broker's Redis, db 0
  POLAR_ENGINE_URL    inference engine (SGLang/vLLM/polar serve)   http://127.0.0.1:30000
                      several replicas: comma-separated URLs (each session sticks to one)
  POLAR_ENGINE        its token API: sglang | vllm        sglang
  POLAR_RENDER        who renders prompts: proxy | engine (the engine's chat API, `polar proxy --render`)   proxy
  POLAR_MODEL_DIR     tokenizer + chat template           fixtures/tiny-qwen2, and required with POLAR_ENGINE_URL
  POLAR_RUNTIME       sandbox runtime                      auto
                      `local` (the harness on the host filesystem, its own results within reach) is refused
                      unless the node opts in with POLAR_ALLOW_LOCAL=1
  POLAR_OUTPUT_ROOT   batch folders (shared storage)       runs/batches
  POLAR_NODE          this node's name (its queues)        the host name
  POLAR_PROXY         reuse a running `polar proxy`: http://HOST:PORT,http://HOST:PORT,CAPTURE_DIR[,CA]
  POLAR_PROXIES       proxy processes on this node (each sample keeps to one)   1
  POLAR_WAY_IN        https_proxy | base_url               https_proxy
  POLAR_INFRA_RETRIES samples retried after an infrastructure failure   2
  POLAR_CONFDIR       the node proxy's CA folder           ~/.polar/mitmproxy
  POLAR_HEARTBEAT_S   how often a node refreshes its heartbeat in Redis   5
  POLAR_LIVENESS_S    a node silent this long is lost; its samples start over elsewhere   30
  POLAR_DRAIN_S       a draining node's running samples may finish within this; the rest are handed over   300
  POLAR_STATUS_S      how often a node prints a status line (0: never)   60
  POLAR_VERIFIER_HOSTS  what the verifier of a task that asks for the internet may reach, through the egress
                      proxy (polar/sandbox/egress.py): names, *.domain, host=target:port   package mirrors, PyPI, uv
"""
from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping
from urllib.parse import urlsplit, urlunsplit

from polar.sandbox.egress import default_allowlist
from polar.sandbox.runtime import RUNTIMES
from polar_mitm.engines.backends import parse_backends
from polar_traj.records import check_id

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_BROKER = "redis://127.0.0.1:6379/1"
# Sending a message rides out a Redis restart (about a minute) instead of failing.
PUBLISH_RETRY = {"max_retries": 60, "interval_start": 0.2, "interval_step": 0.5, "interval_max": 2.0}

MAX_PROXIES = 16

@dataclass(frozen=True)
class WorkerSettings:
    broker: str
    sessions: str
    engine_url: str
    engine: str
    model_dir: Path
    runtime: str
    output_root: Path
    node: str
    proxy: str | None
    way_in: str
    infra_retries: int
    confdir: Path
    heartbeat_s: float = 5.0
    liveness_s: float = 30.0
    drain_s: float = 300.0
    status_s: float = 60.0
    proxies: int = 1
    render: str = "proxy"  # POLAR_RENDER
    verifier_hosts: tuple[str, ...] = ()  # POLAR_VERIFIER_HOSTS (polar/sandbox/egress.py)


def seconds(env: Mapping[str, str], name: str, default: float, zero: bool = False) -> float:
    """A positive number of seconds (or 0, where `zero` allows it: off)."""
    raw = env.get(name, str(default))
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not (value > 0 or (zero and value == 0)):
        raise ValueError(f"{name} {raw!r}: expected a number of seconds above 0" + (" (or 0: off)" if zero else ""))
    return value


def sessions_url(broker: str) -> str:
    """The sessions/fence Redis beside a broker URL: same server, db 0 (`redis://h:p/1` -> `redis://h:p/0`,
    `redis+socket:///s.sock?virtual_host=1` -> `unix:///s.sock?db=0`)."""
    parts = urlsplit(broker)
    if parts.scheme in ("redis", "rediss"):
        return urlunsplit((parts.scheme, parts.netloc, "/0", "", ""))
    if parts.scheme in ("redis+socket", "unix", "socket"):
        return f"unix://{parts.path}?db=0"
    raise ValueError(f"POLAR_BROKER {broker!r}: expected redis://HOST:PORT/DB or redis+socket:///PATH")


def node_name(raw: str) -> str:
    """A node name usable in queue names: the id rule (contract 1)."""
    return check_id(raw, "POLAR_NODE")


def check_runtime(runtime: str, allow_local: str) -> str:
    if runtime not in RUNTIMES:
        raise ValueError(f"POLAR_RUNTIME {runtime!r}: expected one of {', '.join(RUNTIMES)}")
    if runtime == "local" and allow_local != "1":
        raise ValueError("POLAR_RUNTIME=local refused: the agent would run on this node's filesystem and could "
                         "write any file, its own results included; use auto, or set POLAR_ALLOW_LOCAL=1 to opt in")
    return runtime


def load_settings(env: Mapping[str, str] | None = None) -> WorkerSettings:
    env = os.environ if env is None else env
    broker = env.get("POLAR_BROKER", DEFAULT_BROKER)
    engine = env.get("POLAR_ENGINE", "sglang")
    if engine not in ("sglang", "vllm"):
        raise ValueError(f"POLAR_ENGINE {engine!r}: expected sglang or vllm")
    render = env.get("POLAR_RENDER", "proxy")
    if render not in ("proxy", "engine"):
        raise ValueError(f"POLAR_RENDER {render!r}: expected proxy or engine")
    way_in = env.get("POLAR_WAY_IN", "https_proxy")
    if way_in not in ("https_proxy", "base_url"):
        raise ValueError(f"POLAR_WAY_IN {way_in!r}: expected https_proxy or base_url")
    try:
        engine_urls = parse_backends(env.get("POLAR_ENGINE_URL", "http://127.0.0.1:30000"))
    except ValueError as e:
        raise ValueError(f"POLAR_ENGINE_URL: {e}") from e
    # No silent default model: a user's engine recorded with the tiny model's token ids would train on garbage.
    if env.get("POLAR_ENGINE_URL") and not env.get("POLAR_MODEL_DIR"):
        raise ValueError("POLAR_ENGINE_URL needs POLAR_MODEL_DIR: the tokenizer and chat template of the model "
                         "that engine serves")
    runtime = check_runtime(env.get("POLAR_RUNTIME", "auto"), env.get("POLAR_ALLOW_LOCAL", ""))
    retries = env.get("POLAR_INFRA_RETRIES", "2")
    if not retries.isdigit():
        raise ValueError(f"POLAR_INFRA_RETRIES {retries!r}: expected a whole number")
    proxies = env.get("POLAR_PROXIES", "1")
    if not (proxies.isdigit() and 1 <= int(proxies) <= MAX_PROXIES):
        raise ValueError(f"POLAR_PROXIES {proxies!r}: expected 1-{MAX_PROXIES} proxy processes")
    if int(proxies) > 1 and env.get("POLAR_PROXY"):
        raise ValueError("POLAR_PROXIES > 1 starts the node's own proxies; POLAR_PROXY names one running proxy: "
                         "give one or the other")
    try:
        verifier_hosts = default_allowlist(env).entries()
    except ValueError as e:
        raise ValueError(f"POLAR_VERIFIER_HOSTS: {e}") from e
    heartbeat_s, liveness_s = seconds(env, "POLAR_HEARTBEAT_S", 5.0), seconds(env, "POLAR_LIVENESS_S", 30.0)
    if liveness_s < 2 * heartbeat_s:  # one late beat must not make a node lost
        raise ValueError(f"POLAR_LIVENESS_S {liveness_s:g}: expected at least twice POLAR_HEARTBEAT_S ({heartbeat_s:g})")
    return WorkerSettings(
        broker=broker,
        sessions=env.get("POLAR_SESSIONS") or sessions_url(broker),
        engine_url=",".join(engine_urls),
        engine=engine,
        model_dir=Path(env.get("POLAR_MODEL_DIR", str(ROOT / "fixtures" / "tiny-qwen2"))).resolve(),
        runtime=runtime,
        output_root=Path(env.get("POLAR_OUTPUT_ROOT", "runs/batches")).resolve(),
        node=node_name(env.get("POLAR_NODE") or socket.gethostname().split(".")[0]),
        proxy=env.get("POLAR_PROXY") or None,
        way_in=way_in,
        infra_retries=int(retries),
        confdir=Path(env.get("POLAR_CONFDIR", "~/.polar/mitmproxy")).expanduser().resolve(),
        heartbeat_s=heartbeat_s,
        liveness_s=liveness_s,
        drain_s=seconds(env, "POLAR_DRAIN_S", 300.0),
        status_s=seconds(env, "POLAR_STATUS_S", 60.0, zero=True),
        proxies=int(proxies),
        render=render,
        verifier_hosts=verifier_hosts,
    )
