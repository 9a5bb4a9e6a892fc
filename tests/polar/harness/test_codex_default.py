"""Codex CLI with its own default model, as a user runs it (issue 71 item 3): no `--model`, so codex 0.171 sends
its tools in an `additional_tools` input item, namespaced, its shell reached through `exec`, a free-form custom
tool whose input is JavaScript. Through HTTPS_PROXY with a scripted policy: the exec call reaches codex as a
custom_tool_call, codex runs it (polar.txt written), and the session's calls are token-exact and merge into one
trajectory. Before: 400 `input item type 'additional_tools' is not supported` after codex's five retries."""
from __future__ import annotations

from pathlib import Path

import pytest

from polar.harness.adapters import load_adapter
from polar.run.services import start_proxy
from tests.polar.harness.test_harness_matrix import _check_agent_trajectory, _check_tokens_exact, one_run

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[3]


def default_model_adapter(folder: Path) -> Path:
    """adapters/codex.yaml without the model it pins: codex picks its own."""
    text = (ROOT / "adapters" / "codex.yaml").read_text()
    for pinned in ('  - --model\n  - "{{ model }}"\n', '      model = "{{ model }}"\n'):
        assert pinned in text, pinned
        text = text.replace(pinned, "")
    path = folder / "codex-default.yaml"
    path.write_text(text.replace("name: codex\n", "name: codex-default\n"))
    return path


def test_codex_with_its_default_model(tmp_path, start_reference_server, policies_dir, long_model, redis_url):
    backend = start_reference_server(policies_dir / "codex-exec-once.yaml", long_model, "--threads", "2")
    spec = load_adapter(str(default_model_adapter(tmp_path)))
    with start_proxy(long_model, backend, tmp_path / "captures", tmp_path / "mitm", tmp_path / "proxy.log",
                     redis_url) as proxy:
        run = one_run(spec, "https_proxy", tmp_path / "run", backend, long_model, proxy)
    out = run.result.out
    diag = (out / "harness.stderr").read_text()[-1500:]
    assert run.result.exit_code == 0 and (out / "workspace" / "polar.txt").read_text() == "polar\n", diag
    assert len(run.records) == 2 and all(r["error"] is None for r in run.records), diag
    first = run.records[0]
    assert first["request"]["model"] != "gpt-5.5"  # codex's own choice
    assert first["request"]["input"][0]["type"] == "additional_tools"
    call = [item for item in first["response"]["output"] if item["type"] == "custom_tool_call"]
    assert [c["name"] for c in call] == ["exec"] and "tools.exec_command" in call[0]["input"], first["response"]
    outputs = [i for i in run.records[1]["request"]["input"] if i.get("type") == "custom_tool_call_output"]
    assert [o["call_id"] for o in outputs] == [call[0]["call_id"]]
    _check_tokens_exact(run)
    _check_agent_trajectory(run, run.records)
