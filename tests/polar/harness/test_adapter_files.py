"""An adapter's `files:` land only under the sample's HOME or workspace (issue 41): refused when the YAML says
otherwise (an absolute path, `..`), when a template fills a path out of them, and never written through a link a
task's workspace holds (polar/harness/adapters.py, polar/harness/render.py)."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from polar.harness.adapters import AdapterError, load_adapter, parse_adapter
from polar.harness.render import Endpoint, RunValues, render, write_files

ENDPOINT = Endpoint("127.0.0.1", 18080, 18081, Path("/s/ca.pem"), Path("/s/bundle.pem"))


def adapter(path: str) -> dict:
    return {"name": "x", "api": "openai_chat", "model": "m", "provider": {"url": "https://h"},
            "ways_in": {"base_url": {}}, "command": ["x", "{{ instruction }}"],
            "files": [{"path": path, "text": "owned\n"}]}


@pytest.mark.parametrize("path", ["/etc/cron.d/polar", "../../etc/passwd", ".config/../../x", "{{ home }}/../x",
                                  "{{ workspace }}//etc/x", "{{ home }}/"])
def test_a_file_outside_home_and_workspace_is_refused(tmp_path: Path, path: str):
    yaml_file = tmp_path / "evil.yaml"
    yaml_file.write_text(yaml.safe_dump(adapter(path)))
    with pytest.raises(AdapterError) as e:
        load_adapter(yaml_file)
    assert str(e.value).startswith(f"{yaml_file}: files[0].path: {path!r}: a config file lands under the sample's "
                                   "HOME or workspace") and "\n" not in str(e.value)


def test_home_and_workspace_paths_load_and_render(tmp_path: Path):
    for path in (".codex/config.toml", "{{ home }}/.x", "{{workspace}}/.vscode/settings.json"):
        parse_adapter(adapter(path))
    run = RunValues("do it", "m", tmp_path / "home", tmp_path / "ws", "s", "t", "base_url")
    files = render(parse_adapter(adapter("{{ workspace }}/.vscode/s.json")), run, ENDPOINT, []).files
    assert list(files) == [tmp_path / "ws" / ".vscode" / "s.json"]


def test_a_template_that_fills_a_path_out_is_refused(tmp_path: Path):
    spec = parse_adapter(adapter("notes/{{ instruction }}"))
    run = RunValues("../../../etc/cron.d/x", "m", tmp_path / "home", tmp_path / "ws", "s", "t", "base_url")
    with pytest.raises(ValueError, match=r"^adapter x: files\[0\].path: 'notes/\{\{ instruction \}\}' lands at "
                                         r"/.*etc/cron.d/x, outside the sample's HOME and workspace$"):
        render(spec, run, ENDPOINT, [])


def test_no_link_in_the_workspace_is_followed(tmp_path: Path):
    """A task's workspace holding `.vscode -> a host folder`: the host writes nothing there."""
    host = tmp_path / "host"
    host.mkdir()
    (tmp_path / "ws").mkdir()
    (tmp_path / "ws" / ".vscode").symlink_to(host)
    run = RunValues("do it", "m", tmp_path / "home", tmp_path / "ws", "s", "t", "base_url")
    files = render(parse_adapter(adapter("{{ workspace }}/.vscode/s.json")), run, ENDPOINT, []).files
    with pytest.raises(ValueError, match="without following a link"):
        write_files(files, (run.home, run.workspace))
    (tmp_path / "ws" / ".vscode").unlink()
    (tmp_path / "ws" / ".vscode").mkdir()
    (tmp_path / "ws" / ".vscode" / "s.json").symlink_to(host / "planted")
    with pytest.raises(ValueError, match="without following a link"):
        write_files(files, (run.home, run.workspace))
    assert list(host.iterdir()) == []
    with pytest.raises(ValueError, match="outside the sample's HOME and workspace"):
        write_files({host / "x": "owned\n"}, (run.home, run.workspace))
