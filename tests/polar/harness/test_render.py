"""Rendering an adapter for one run: argv, a clean environment per way in, config files from templates."""
from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from polar.harness.adapters import load_adapter, parse_adapter
from polar.harness.render import Endpoint, RunValues, fill, redact, render, write_files

ENDPOINT = Endpoint("127.0.0.1", 18080, 18081, Path("/s/ca.pem"), Path("/s/bundle.pem"))


def values(tmp_path: Path, way_in: str, instruction: str = "say 'hi' {{ model }}") -> RunValues:
    return RunValues(instruction, "m1", tmp_path / "home", tmp_path / "ws", "sess-1", "tok-1", way_in)


def test_fill_leaves_other_braces_alone():
    assert fill('{"a": {"b": "{{ x }}"}} {env:K} ${y}', {"x": "1"}) == '{"a": {"b": "1"}} {env:K} ${y}'


def test_https_proxy_env(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "leaked")
    monkeypatch.setenv("HTTPS_PROXY", "http://elsewhere:1")
    r = render(load_adapter("codex"), values(tmp_path, "https_proxy"), ENDPOINT, [Path("/tools/bin")])
    env = r.env
    assert env["HTTPS_PROXY"] == "http://sess-1:tok-1@127.0.0.1:18080" == env["https_proxy"]
    assert env["NODE_EXTRA_CA_CERTS"] == "/s/ca.pem" and env["SSL_CERT_FILE"] == "/s/bundle.pem"
    assert env["CODEX_CA_CERTIFICATE"] == "/s/ca.pem" and env["POLAR_API_KEY"] == "tok-1"
    assert env["HOME"] == str(tmp_path / "home") and env["PATH"].startswith("/tools/bin:")
    assert "OPENAI_API_KEY" not in env  # nothing leaks in from the caller
    config = tomllib.loads(r.files[tmp_path / "home" / ".codex" / "config.toml"])
    assert config["model_providers"]["polar"]["base_url"] == "https://api.openai.com/v1"
    assert config["model"] == "m1" and config["model_providers"]["polar"]["supports_websockets"] is False


def test_base_url_env(tmp_path):
    r = render(load_adapter("claude-code"), values(tmp_path, "base_url"), ENDPOINT, [])
    assert "HTTPS_PROXY" not in r.env and "NODE_EXTRA_CA_CERTS" not in r.env
    assert r.env["ANTHROPIC_BASE_URL"] == "http://127.0.0.1:18081"
    assert r.env["ANTHROPIC_API_KEY"] == "tok-1" and r.env["IS_SANDBOX"] == "1"
    assert r.argv[:3] == ("claude", "-p", "say 'hi' {{ model }}")  # the instruction is not a template


def test_json_files_render_keys_and_values(tmp_path):
    r = render(load_adapter("opencode"), values(tmp_path, "base_url"), ENDPOINT, [])
    path = tmp_path / "home" / ".config" / "opencode" / "opencode.json"
    config = json.loads(r.files[path])
    provider = config["provider"]["polar"]
    assert provider["options"] == {"baseURL": "http://127.0.0.1:18081/v1", "apiKey": "{env:POLAR_API_KEY}"}
    assert list(provider["models"]) == ["m1"] and config["model"] == "polar/m1"
    write_files(r.files, (tmp_path / "home", tmp_path / "ws"))
    assert json.loads(path.read_text()) == config


def test_unsupported_way_in(tmp_path):
    spec = parse_adapter({"name": "x", "api": "gemini", "model": "m", "provider": {"url": "https://h"},
                          "ways_in": {"base_url": {}}, "command": ["x", "{{ instruction }}"]})
    with pytest.raises(ValueError, match="does not support the https_proxy way in"):
        render(spec, values(tmp_path, "https_proxy"), ENDPOINT, [])


def test_redact():
    assert redact({"A": "http://s:tok-1@h", "B": "x"}, "tok-1") == {"A": "http://s:<token>@h", "B": "x"}
