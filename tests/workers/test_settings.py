"""workers.settings: configuration from the environment, local defaults, clear errors."""
from __future__ import annotations

import pytest

from workers.settings import load_settings, sessions_url


def test_local_defaults():
    s = load_settings({"POLAR_NODE": "n1"})
    assert s.broker == "redis://127.0.0.1:6379/1"
    assert s.sessions == "redis://127.0.0.1:6379/0"  # sessions + fence beside the broker, db 0
    assert (s.engine_url, s.engine, s.runtime, s.node, s.infra_retries) == (
        "http://127.0.0.1:30000", "sglang", "auto", "n1", 2)
    assert s.model_dir.name == "tiny-qwen2" and s.output_root.is_absolute()


@pytest.mark.parametrize("broker, sessions", [
    ("redis://10.0.0.5:6380/3", "redis://10.0.0.5:6380/0"),
    ("redis+socket:///run/redis.sock?virtual_host=1", "unix:///run/redis.sock?db=0"),
])
def test_sessions_beside_the_broker(broker, sessions):
    assert sessions_url(broker) == sessions


@pytest.mark.parametrize("env, message", [
    ({"POLAR_BROKER": "amqp://x"}, "POLAR_BROKER"),
    ({"POLAR_ENGINE": "tgi"}, "POLAR_ENGINE"),
    ({"POLAR_WAY_IN": "ws"}, "POLAR_WAY_IN"),
    ({"POLAR_INFRA_RETRIES": "two"}, "POLAR_INFRA_RETRIES"),
    ({"POLAR_NODE": "bad node"}, "POLAR_NODE"),
])
def test_bad_settings_name_the_variable(env, message):
    with pytest.raises(ValueError, match=message):
        load_settings(env)
