"""Real `celery -A workers worker` processes as "nodes" on this machine, each with its own proxy, for tests and
bench/rollout.py. A node is ready when its log says so; `stop()` ends it (TERM, then KILL)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Node:
    name: str
    proc: subprocess.Popen
    log: Path

    def pool_pids(self) -> list[int]:
        """The worker's pool processes (children of the main process that run tasks)."""
        out = subprocess.run(["ps", "-o", "pid=,args=", "--ppid", str(self.proc.pid)], capture_output=True,
                             text=True).stdout
        return [int(line.split()[0]) for line in out.splitlines() if "celery" in line]

    def signal_group(self, sig: int) -> None:
        """Signal the node's whole process group (spawned with `own_group`): worker, pool, proxy, sandboxes."""
        os.killpg(self.proc.pid, sig)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def node_env(broker: str, sessions: str, engine_url: str, model_dir: Path, output_root: Path, name: str,
             runtime: str = "bwrap", **extra: str) -> dict[str, str]:
    return {**os.environ, "POLAR_BROKER": broker, "POLAR_SESSIONS": sessions, "POLAR_ENGINE_URL": engine_url,
            "POLAR_MODEL_DIR": str(model_dir), "POLAR_RUNTIME": runtime, "POLAR_OUTPUT_ROOT": str(output_root),
            "POLAR_NODE": name, "POLAR_CONFDIR": str(output_root / "nodes" / name / "confdir"),
            "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", **extra}


def start_node(env: dict[str, str], concurrency: int = 1, timeout_s: float = 300.0, own_group: bool = False) -> Node:
    return wait_ready(spawn_node(env, concurrency, own_group), timeout_s)


def spawn_node(env: dict[str, str], concurrency: int = 1, own_group: bool = False) -> Node:
    """`own_group`: the node gets its own process group (and session), so a test can kill all of it at once, as
    an OOM kill or a lost machine would."""
    name = env["POLAR_NODE"]
    log = Path(env["POLAR_OUTPUT_ROOT"]) / "nodes" / name / "worker.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "celery", "-A", "workers", "worker", "-n", f"{name}@%h", "-c", str(concurrency),
           "-P", "prefork", "--loglevel", "INFO", "--without-gossip", "--without-mingle"]
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=own_group)
    return Node(name, proc, log)


def wait_ready(node: Node, timeout_s: float = 300.0) -> Node:
    """Wait for the worker's "ready." line (its proxy is up by then); stop it and raise if it never comes."""
    deadline = time.monotonic() + timeout_s
    while " ready." not in node.log.read_text(errors="replace"):
        if node.proc.poll() is not None or time.monotonic() > deadline:
            node.stop()
            raise RuntimeError(f"worker {node.name} did not start:\n{node.log.read_text(errors='replace')[-3000:]}")
        time.sleep(0.2)
    return node
