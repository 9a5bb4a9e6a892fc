"""workers.settings: configuration from the environment, local defaults, clear errors."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from workers.settings import load_settings, sessions_url


def test_local_defaults():
    s = load_settings({"POLAR_NODE": "n1"})
    assert s.broker == "redis://127.0.0.1:6379/1"
    assert s.sessions == "redis://127.0.0.1:6379/0"  # sessions + fence beside the broker, db 0
    assert (s.engine_url, s.engine, s.runtime, s.node, s.infra_retries) == (
        "http://127.0.0.1:30000", "sglang", "auto", "n1", 2)
    assert s.model_dir.name == "tiny-qwen2" and s.output_root.is_absolute()


def test_the_verifiers_hosts_are_the_nodes_to_give():
    """A node gives the verifier of a task that asks for the internet its own list (never the submitter's)."""
    from polar.sandbox.egress import DEFAULT_HOSTS

    assert load_settings({}).verifier_hosts == DEFAULT_HOSTS
    assert load_settings({"POLAR_VERIFIER_HOSTS": "mirror.lan=127.0.0.1:3142, *.pypi.lan"}).verifier_hosts == (
        "mirror.lan=127.0.0.1:3142", "*.pypi.lan")


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
    ({"POLAR_ENGINE_URL": "http://10.0.0.2:30000"}, "POLAR_MODEL_DIR"),
    ({"POLAR_VERIFIER_HOSTS": "https://pypi.org"}, "POLAR_VERIFIER_HOSTS"),
])
def test_bad_settings_name_the_variable(env, message):
    with pytest.raises(ValueError, match=message):
        load_settings(env)


def test_runtime_local_is_refused_unless_the_node_opts_in():
    with pytest.raises(ValueError, match="POLAR_RUNTIME=local refused.*POLAR_ALLOW_LOCAL=1"):
        load_settings({"POLAR_NODE": "n1", "POLAR_RUNTIME": "local"})
    with pytest.raises(ValueError, match="POLAR_RUNTIME=local refused"):
        load_settings({"POLAR_NODE": "n1", "POLAR_RUNTIME": "local", "POLAR_ALLOW_LOCAL": "yes"})
    assert load_settings({"POLAR_NODE": "n1", "POLAR_RUNTIME": "local", "POLAR_ALLOW_LOCAL": "1"}).runtime == "local"
    assert load_settings({"POLAR_NODE": "n1", "POLAR_RUNTIME": "bwrap"}).runtime == "bwrap"
    with pytest.raises(ValueError, match="POLAR_RUNTIME 'kvm'"):
        load_settings({"POLAR_NODE": "n1", "POLAR_RUNTIME": "kvm"})


def test_a_local_worker_refuses_to_start_with_one_line():
    """`POLAR_RUNTIME=local celery -A workers worker`: exit 1, one line on stderr, no worker."""
    root = Path(__file__).resolve().parents[2]
    celery = Path(sys.executable).with_name("celery")
    env = {k: v for k, v in os.environ.items() if k != "POLAR_ALLOW_LOCAL"} | {"POLAR_RUNTIME": "local"}
    proc = subprocess.run([str(celery), "-A", "workers", "worker"], cwd=root, env=env, capture_output=True,
                          text=True, timeout=120)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 1 and len(lines) == 1, proc.stderr
    assert lines[0].startswith("polar worker: POLAR_RUNTIME=local refused") and "POLAR_ALLOW_LOCAL=1" in lines[0]


def test_liveness_settings():
    s = load_settings({"POLAR_NODE": "n1"})
    assert (s.heartbeat_s, s.liveness_s, s.drain_s) == (5.0, 30.0, 300.0)
    s = load_settings({"POLAR_NODE": "n1", "POLAR_HEARTBEAT_S": "0.5", "POLAR_LIVENESS_S": "3"})
    assert (s.heartbeat_s, s.liveness_s) == (0.5, 3.0)
    with pytest.raises(ValueError, match="POLAR_LIVENESS_S 4: expected at least twice POLAR_HEARTBEAT_S"):
        load_settings({"POLAR_NODE": "n1", "POLAR_HEARTBEAT_S": "3", "POLAR_LIVENESS_S": "4"})
    with pytest.raises(ValueError, match="POLAR_HEARTBEAT_S 'soon'"):
        load_settings({"POLAR_NODE": "n1", "POLAR_HEARTBEAT_S": "soon"})
