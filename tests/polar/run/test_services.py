"""Services of a run: the long-context view of a model directory, sessions for open and Redis proxies."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import redis

from polar.run.services import context_view, new_session
from polar_mitm.launch import ProxyProcess
from polar_mitm.sessions.registry import REDIS_PREFIX


def test_context_view(tmp_path, tiny_model_dir):
    view = context_view(tiny_model_dir, 65536, tmp_path)
    assert view.name == tiny_model_dir.name  # the served model name stays
    assert json.loads((view / "config.json").read_text())["max_position_embeddings"] == 65536
    assert (view / "tokenizer.json").resolve() == (tiny_model_dir / "tokenizer.json").resolve()
    assert json.loads((tiny_model_dir / "config.json").read_text())["max_position_embeddings"] == 4096
    assert context_view(tiny_model_dir, 0, tmp_path) == tiny_model_dir
    assert context_view(tiny_model_dir, 1024, tmp_path) == tiny_model_dir  # already long enough


def handle(sessions: str) -> ProxyProcess:
    return ProxyProcess("127.0.0.1", 1, 2, Path("ca.pem"), Path("captures"), sessions)


def test_open_session():
    s = new_session(handle("open"), "task", "sess-1")
    assert (s.task_id, s.session_id) == ("local", "sess-1") and s.token.startswith("polar-")
    assert new_session(handle("open"), "task", "sess-1").token != s.token


def test_registered_session(redis_url):
    s = new_session(handle(redis_url), "task-9", "sess-2")
    stored = json.loads(redis.Redis.from_url(redis_url).get(REDIS_PREFIX + s.token))
    assert stored == {"task_id": "task-9", "session_id": "sess-2"} and (s.task_id, s.session_id) == ("task-9", "sess-2")


def test_a_registered_session_carries_its_cap_and_sampling(redis_url):
    s = new_session(handle(redis_url), "task-9", "sess-3", max_calls=2, sampling={"temperature": 0.7, "seed": 1})
    stored = json.loads(redis.Redis.from_url(redis_url).get(REDIS_PREFIX + s.token))
    assert stored["max_calls"] == 2 and stored["sampling"]["temperature"] == 0.7
    assert stored["sampling"]["seed"] != 1  # the session's own seed, from the base seed and its id
    with pytest.raises(ValueError, match="top_p"):
        new_session(handle(redis_url), "task-9", "sess-4", sampling={"top_p": 2})


def test_open_mode_refuses_fixed_sampling_and_ignores_the_cap():
    assert new_session(handle("open"), "task", "sess-1", max_calls=2).session_id == "sess-1"
    with pytest.raises(ValueError, match="registered sessions"):
        new_session(handle("open"), "task", "sess-1", sampling={"temperature": 0.7})


def test_a_killed_parent_leaves_no_proxy_behind(tmp_path, tiny_model_dir):
    """A worker or `polar run` killed with SIGKILL cannot stop its proxy; the proxy goes by itself."""
    import os
    import signal
    import subprocess
    import sys
    import time

    script = (
        "import sys, time\n"
        "from pathlib import Path\n"
        "from polar.run.services import start_proxy\n"
        f"t = Path({str(tmp_path)!r})\n"
        f"with start_proxy(Path({str(tiny_model_dir)!r}), 'http://127.0.0.1:9', t / 'cap', t / 'conf', t / 'proxy.log'):\n"
        "    print('ready', flush=True)\n"
        "    time.sleep(600)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout.readline().strip() == "ready"
        children = [int(p) for p in
                    Path(f"/proc/{parent.pid}/task/{parent.pid}/children").read_text().split()]
        assert children, "the proxy is the parent's child"
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        deadline = time.monotonic() + 30
        while any(Path(f"/proc/{pid}").exists() and "Z" not in _state(pid) for pid in children):
            assert time.monotonic() < deadline, "the proxy outlived its parent"
            time.sleep(0.2)
    finally:
        if parent.poll() is None:
            os.kill(parent.pid, signal.SIGKILL)


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "Z"


def test_a_proxy_whose_port_was_taken_starts_on_fresh_ports(tmp_path, tiny_model_dir, monkeypatch):
    """Between picking a free port and the proxy's bind, another process may take it (CI lost a whole module's
    nodes to this): the launcher sees "address already in use" and starts again on fresh ports."""
    import socket

    import polar.run.services as services
    from polar_mitm.launch import free_port

    squatter = socket.socket()
    squatter.bind(("127.0.0.1", 0))
    squatter.listen()
    taken = squatter.getsockname()[1]
    picks = iter([taken, free_port()])
    monkeypatch.setattr(services, "free_port", lambda: next(picks, None) or free_port())
    try:
        with services.start_proxy(tiny_model_dir, "http://127.0.0.1:9", tmp_path / "cap", tmp_path / "confdir",
                                  tmp_path / "proxy.log") as proxy:
            assert proxy.proxy_port != taken and proxy.ca_cert.is_file()
            with socket.create_connection(("127.0.0.1", proxy.base_url_port), timeout=5):
                pass
    finally:
        squatter.close()
