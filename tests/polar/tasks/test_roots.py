"""The tasks root (issue 41, polar/tasks/roots.py): a task file's workspace, tests and adapter, and a Harbor task's
folders, resolve under the root the operator chose; a path or a link out of it is one line naming the field."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from polar.tasks.roots import TASKS_ROOT_ENV
from polar.tasks.load import load_tasks
from polar.tasks.task import TaskError
from workers.manifest import Manifest, SampleEntry, read_manifest, write_manifest

ROOT = Path(__file__).resolve().parents[3]
HARBOR = ROOT / "fixtures" / "harbor"


@pytest.fixture
def tasks(tmp_path: Path, monkeypatch) -> Path:
    """tmp/tasks (the task file's folder, also the current directory) beside tmp/host-secret."""
    monkeypatch.delenv(TASKS_ROOT_ENV, raising=False)
    (tmp_path / "tasks" / "repo").mkdir(parents=True)
    (tmp_path / "host-secret").mkdir()
    (tmp_path / "host-secret" / "id_rsa").write_text("PRIVATE\n")
    monkeypatch.chdir(tmp_path / "tasks")
    return tmp_path / "tasks"


def task_file(folder: Path, **fields) -> Path:
    path = folder / "tasks.yaml"
    task = {"task_id": "fix-x", "instruction": "Fix it.", "workspace": "repo", "image": "host",
            "evaluator": {"command": "true"}, "submit": ["*.py"], **fields}
    path.write_text(yaml.safe_dump([task]))
    return path


@pytest.mark.parametrize("workspace", ["../host-secret", "/etc"])
def test_a_workspace_outside_the_tasks_root_is_refused(tasks: Path, workspace: str):
    with pytest.raises(TaskError) as e:
        load_tasks(task_file(tasks, workspace=workspace))
    message = str(e.value)
    assert "\n" not in message and ": workspace: " in message
    assert f"{workspace!r} is outside the tasks root {tasks}" in message and "--tasks-root" in message


def test_a_link_out_of_the_tasks_root_is_refused(tasks: Path):
    (tasks / "innocent").symlink_to(tasks.parent / "host-secret")
    with pytest.raises(TaskError, match=r": workspace: 'innocent' is outside the tasks root"):
        load_tasks(task_file(tasks, workspace="innocent"))
    (tasks / "t").symlink_to("/etc")
    with pytest.raises(TaskError, match=r": tests: 't' is outside the tasks root"):
        load_tasks(task_file(tasks, tests="t"))


def test_the_operator_widens_the_root(tasks: Path, monkeypatch):
    path = task_file(tasks, workspace="../host-secret")
    assert load_tasks(path, tasks.parent)[0].workspace == tasks.parent / "host-secret"  # --tasks-root
    monkeypatch.setenv(TASKS_ROOT_ENV, str(tasks.parent))
    assert load_tasks(path)[0].workspace == tasks.parent / "host-secret"
    monkeypatch.setenv(TASKS_ROOT_ENV, str(tasks / "repo"))  # the env names the root: the file's folder is not in it
    with pytest.raises(TaskError, match="outside the tasks root"):
        load_tasks(task_file(tasks, workspace="."))


def test_an_adapter_by_path_outside_both_roots_is_refused(tasks: Path):
    evil = tasks.parent / "host-secret" / "evil.yaml"
    with pytest.raises(TaskError, match=r": adapter: '.*evil.yaml' is outside the tasks root .* and the adapters root"):
        load_tasks(task_file(tasks, adapter=str(evil)))
    assert load_tasks(task_file(tasks, adapter=str(ROOT / "adapters" / "pi.yaml")))[0].adapter.endswith("pi.yaml")
    assert load_tasks(task_file(tasks, adapter="pi"))[0].adapter == "pi"


def test_a_relative_adapter_path_is_relative_to_the_task_file(tasks: Path, tmp_path: Path, monkeypatch):
    """`adapter: ./mine.yaml` names the file beside the task file (docs/tasks.md), wherever polar runs from, and
    it loads as that adapter, not as an unknown adapter name."""
    from polar.harness.adapters import load_adapter

    (tasks / "mine.yaml").write_text((ROOT / "adapters" / "pi.yaml").read_text())
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    task = load_tasks(task_file(tasks, adapter="./mine.yaml"))[0]
    assert task.adapter == str((tasks / "mine.yaml").resolve())
    assert load_adapter(task.adapter).name == load_adapter("pi").name
    with pytest.raises(TaskError, match=r": adapter: '../host-secret/x.yaml' is outside the tasks root"):
        load_tasks(task_file(tasks, adapter="../host-secret/x.yaml"))


def test_a_harbor_workspace_linked_to_a_host_folder_is_refused(tmp_path: Path, monkeypatch):
    """environment/workspace -> a host folder: refused, so the folder reaches neither the sandbox nor captures."""
    monkeypatch.delenv(TASKS_ROOT_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    secret = tmp_path / "home-of-operator"
    secret.mkdir()
    (secret / "token").write_text("s3cret\n")
    dataset = tmp_path / "dataset"
    shutil.copytree(HARBOR / "fix-mul", dataset / "fix-mul")
    monkeypatch.chdir(dataset)
    workspace = dataset / "fix-mul" / "environment" / "workspace"
    shutil.rmtree(workspace)
    workspace.symlink_to(secret)
    with pytest.raises(TaskError) as e:
        load_tasks(dataset)
    assert str(e.value) == (f"{dataset / 'fix-mul'}: environment/workspace: {str(secret)!r} is outside the tasks "
                            f"root {dataset} (--tasks-root or {TASKS_ROOT_ENV} names another)")
    workspace.unlink()
    (dataset / "fix-mul" / "tests").rename(tmp_path / "tests")
    (dataset / "fix-mul" / "tests").symlink_to(tmp_path / "tests")
    with pytest.raises(TaskError, match=r"fix-mul: tests: .* is outside the tasks root"):
        load_tasks(dataset / "fix-mul")


def test_the_fixtures_load_from_anywhere(tmp_path: Path, monkeypatch):
    monkeypatch.delenv(TASKS_ROOT_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    assert len(load_tasks(ROOT / "fixtures" / "tasks" / "tasks.yaml")) == 3 and len(load_tasks(HARBOR)) == 3


def test_a_batch_keeps_its_submitters_root(tmp_path: Path):
    """The manifest carries the root the submitter chose, so every node holds the batch's tasks to it."""
    m = Manifest("b1", tmp_path, tmp_path / "tasks.jsonl", 1, (SampleEntry("b1.t.0", "t", "b1.t"),),
                 tasks_roots=("/srv/tasks",))
    assert tuple(read_manifest(write_manifest(m)).tasks_roots) == ("/srv/tasks",)
