"""Services of a run: the long-context view of a model directory, sessions for open and Redis proxies."""
from __future__ import annotations

import json
from pathlib import Path

import redis

from polar.services import ProxyHandle, context_view, new_session
from polar_mitm.sessions import REDIS_PREFIX


def test_context_view(tmp_path, tiny_model_dir):
    view = context_view(tiny_model_dir, 65536, tmp_path)
    assert view.name == tiny_model_dir.name  # the served model name stays
    assert json.loads((view / "config.json").read_text())["max_position_embeddings"] == 65536
    assert (view / "tokenizer.json").resolve() == (tiny_model_dir / "tokenizer.json").resolve()
    assert json.loads((tiny_model_dir / "config.json").read_text())["max_position_embeddings"] == 4096
    assert context_view(tiny_model_dir, 0, tmp_path) == tiny_model_dir
    assert context_view(tiny_model_dir, 1024, tmp_path) == tiny_model_dir  # already long enough


def handle(sessions: str) -> ProxyHandle:
    return ProxyHandle("127.0.0.1", 1, 2, Path("ca.pem"), Path("captures"), sessions)


def test_open_session():
    s = new_session(handle("open"), "task", "sess-1")
    assert (s.task_id, s.session_id) == ("local", "sess-1") and s.token.startswith("polar-")
    assert new_session(handle("open"), "task", "sess-1").token != s.token


def test_registered_session(redis_url):
    s = new_session(handle(redis_url), "task-9", "sess-2")
    stored = json.loads(redis.Redis.from_url(redis_url).get(REDIS_PREFIX + s.token))
    assert stored == {"task_id": "task-9", "session_id": "sess-2"} and (s.task_id, s.session_id) == ("task-9", "sess-2")
