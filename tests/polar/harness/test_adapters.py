"""Adapter spec: the six shipped YAML files load, match the pinned CLIs, and bad files fail naming file and field."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from polar.harness.adapters import ADAPTERS_DIR, AdapterError, adapter_path, available, load_adapter, parse_adapter

ROOT = Path(__file__).resolve().parents[3]
SIX = ["claude-code", "codex", "gemini-cli", "opencode", "pi", "qwen-code"]


def minimal(**overrides: Any) -> dict[str, Any]:
    data = {
        "name": "my-agent", "api": "openai_chat", "model": "m",
        "provider": {"url": "https://api.openai.com/v1", "base_path": "/v1"},
        "ways_in": {"https_proxy": {}, "base_url": {"env": {"OPENAI_BASE_URL": "{{ base_url }}"}}},
        "command": ["my-agent", "--prompt", "{{ instruction }}"],
    }
    data.update(overrides)
    return data


def error_of(data: Any) -> str:
    with pytest.raises(AdapterError) as e:
        parse_adapter(data, "adapters/my-agent.yaml")
    return str(e.value)


def test_the_six_adapters_load():
    assert set(SIX) <= set(available())
    for name in SIX:
        spec = load_adapter(name)
        assert spec.name == name and spec.source.endswith(f"{name}.yaml")
        assert set(spec.ways_in) == {"https_proxy", "base_url"}
        assert spec.shell_tool is not None and spec.package is not None


def test_adapter_versions_match_the_pinned_clis():
    pinned = json.loads((ROOT / "scripts" / "harnesses" / "package.json").read_text())["dependencies"]
    for name in SIX:
        package = load_adapter(name).package
        assert pinned.get(package.npm) == package.version, f"{name}: {package} vs package.json"


def test_minimal_custom_harness():
    spec = parse_adapter(minimal(), "x.yaml")
    assert spec.command == ("my-agent", "--prompt", "{{ instruction }}")
    assert spec.package is None and spec.files == () and spec.env == {}
    assert spec.provider.base_path == "/v1" and spec.supports("base_url")


def test_load_by_name_or_path(tmp_path):
    assert adapter_path("codex") == ADAPTERS_DIR / "codex.yaml"
    f = tmp_path / "mine.yaml"
    f.write_text(yaml.safe_dump(minimal()))
    assert load_adapter(str(f)).name == "my-agent"


def test_unknown_adapter_lists_the_available_ones():
    with pytest.raises(AdapterError, match="no such adapter.*codex"):
        load_adapter("no-such-harness")


def test_bad_yaml_names_the_file(tmp_path):
    f = tmp_path / "broken.yaml"
    f.write_text("name: [unclosed\n")
    with pytest.raises(AdapterError, match=f"{f}:2: not valid YAML") as e:
        load_adapter(str(f))
    assert "\n" not in str(e.value)  # one line


@pytest.mark.parametrize("data, where, why", [
    ([1, 2], "top level", "expected a mapping"),
    (minimal(colour="red"), "top level", "unknown key"),
    ({k: v for k, v in minimal().items() if k != "model"}, "model", "missing"),
    (minimal(name="My Agent"), "name", "lowercase"),
    (minimal(api="openai"), "api", "not one of"),
    (minimal(provider={"url": "http://api.openai.com"}), "provider.url", "https://"),
    (minimal(provider={"url": "https://x", "base_path": "v1"}), "provider.base_path", "starting with '/'"),
    (minimal(ways_in={}), "ways_in", "at least one"),
    (minimal(ways_in={"socks": {}}), "ways_in", "not one of"),
    (minimal(ways_in={"base_url": {"args": []}}), "ways_in.base_url", "unknown key"),
    (minimal(command="my-agent {{ instruction }}"), "command", "list of strings"),
    (minimal(command=["my-agent"]), "command", "instruction is never passed"),
    (minimal(command=["a", "{{ prompt }}"]), "command", "unknown template variable"),
    (minimal(env={"A": True}), "env.A", "quote it"),
    (minimal(env={"1A": "x"}), "env", "not an environment variable"),
    (minimal(files=[{"path": "a.json"}]), "files[0]", "exactly one of"),
    (minimal(files=[{"path": "a", "text": "x", "json": {}}]), "files[0]", "exactly one of"),
    (minimal(files=[{"path": "a", "json": {"k": "{{ nope }}"}}]), "files[0]", "unknown template variable"),
    (minimal(package={"npm": "x", "version": 1.2, "bin": "x"}), "package.version", "pinned version"),
    (minimal(shell_tool={"name": "bash"}), "shell_tool.argument", "missing"),
])
def test_errors_name_file_and_field(data, where, why):
    message = error_of(data)
    assert message.startswith(f"adapters/my-agent.yaml: {where}:"), message
    assert why in message


def test_instruction_may_come_through_env_or_files():
    spec = parse_adapter(minimal(command=["agent"], env={"TASK": "{{ instruction }}"}), "x.yaml")
    assert spec.env == {"TASK": "{{ instruction }}"}
    spec = parse_adapter(minimal(command=["agent"], files=[{"path": "task.txt", "text": "{{ instruction }}"}]),
                         "x.yaml")
    assert spec.files[0].path == "task.txt"


def test_spec_is_frozen():
    spec = load_adapter("pi")
    with pytest.raises(AttributeError):
        spec.name = "other"  # type: ignore[misc]
