"""polar/sandbox/supervisor.py as a worker node uses it (workers/node.py starts it before the pool forks): a node
process and its forked pool register what they start; the watchdog stops it only once every one of them is
gone (the pool outliving its main process keeps it waiting), and leaves alone what was released."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.polar.run.test_killed_run import alive

NODE = r"""
import os, subprocess, sys, time
from pathlib import Path
from polar.sandbox import supervisor

out = Path(sys.argv[1])
watchdog = supervisor.start_supervisor()
(out / "watchdog.pid").write_text(str(watchdog.proc.pid))
if os.fork() == 0:  # a pool process: registers what it starts on the pipe it inherited
    sandbox = subprocess.Popen(["sleep", "600"], start_new_session=True)  # a sandbox: a group of its own
    supervisor.watch_group(sandbox.pid)
    supervisor.watch_command("instance", ["touch", str(out / "stopped")])
    supervisor.watch_command("released", ["touch", str(out / "released-but-stopped")])
    supervisor.release("released")
    (out / "sandbox.pid").write_text(str(sandbox.pid))
    (out / "pool.pid").write_text(str(os.getpid()))
    time.sleep(600)
time.sleep(600)
"""


def wait_for(path: Path, timeout_s: float = 30) -> str:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert time.monotonic() < deadline, f"{path.name} never appeared"
        time.sleep(0.05)
    return path.read_text()


def gone_within(pids: set[int], timeout_s: float = 15) -> set[int]:
    deadline = time.monotonic() + timeout_s
    while (left := alive(pids)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def test_the_watchdog_stops_what_a_killed_node_and_its_pool_started(tmp_path):
    root = Path(__file__).resolve().parents[3]
    node = subprocess.Popen([sys.executable, "-c", NODE, str(tmp_path)], cwd=root, start_new_session=True)
    try:
        pool = int(wait_for(tmp_path / "pool.pid"))
        sandbox, watchdog = int(wait_for(tmp_path / "sandbox.pid")), int(wait_for(tmp_path / "watchdog.pid"))
        os.kill(node.pid, signal.SIGKILL)  # the main process only: its pool still holds the pipe
        node.wait(10)
        time.sleep(1.0)
        assert alive({sandbox, watchdog}) == {sandbox, watchdog} and not (tmp_path / "stopped").exists()
        os.killpg(node.pid, signal.SIGKILL)  # the rest of the node's group: the pool; not the sandbox's group
        assert gone_within({pool, sandbox, watchdog}) == set()
        assert (tmp_path / "stopped").exists() and not (tmp_path / "released-but-stopped").exists()
    finally:
        for pid_file in ("pool.pid", "sandbox.pid", "watchdog.pid"):
            try:
                os.kill(int((tmp_path / pid_file).read_text()), signal.SIGKILL)
            except (OSError, ValueError):
                pass
