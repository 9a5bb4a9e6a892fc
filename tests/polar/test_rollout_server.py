"""`python -m polar.rollout_server` (polar/rollout_server.py) with no broker: its private Redis lives exactly as
long as the server, however it is stopped (a plain `kill`, as a service manager sends, or Ctrl-C)."""
from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def answers(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_stopping_the_server_stops_its_private_redis(tmp_path, sig) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "POLAR_API_TOKEN": "x" * 20}
    env.pop("POLAR_BROKER", None)
    proc = subprocess.Popen([sys.executable, "-m", "polar.rollout_server", "--port", str(port), "--out",
                             str(tmp_path / "out")], cwd=tmp_path, env=env, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stderr.readline()
        found = re.search(r"private Redis at redis://127\.0\.0\.1:(\d+)/1", line)
        assert found, line
        redis_port = int(found.group(1))
        deadline = time.monotonic() + 60
        while not answers(port):  # the HTTP server is up
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
            time.sleep(0.2)
        assert answers(redis_port)
        proc.send_signal(sig)
        proc.wait(timeout=30)
    finally:
        proc.kill()
    assert not answers(redis_port), f"redis-server on {redis_port} outlived the server ({sig.name})"
