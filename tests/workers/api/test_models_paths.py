"""What a body may point at (issue 41, workers/api/models.py): an adapter by path only under the adapters root,
task paths only under the service's tasks root; each refusal names the field."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from polar.tasks.roots import DEFAULT_ADAPTERS_ROOT
from polar.tasks.load import load_tasks
from polar.tasks.task import TaskError
from workers.api.models import BadRequest, ShortTask, TaskRequest, from_short, from_task_request

EVALUATOR = {"command": "true"}


def test_an_adapter_by_path_must_live_under_the_adapters_root(tmp_path: Path, monkeypatch):
    """A token holder's own adapter YAML would have the node write its `files:` and run its command (issue 41)."""
    monkeypatch.delenv("POLAR_ADAPTERS_ROOT", raising=False)
    evil = tmp_path / "evil.yaml"
    for harness in (str(evil), "../../../tmp/evil.yaml"):
        with pytest.raises(BadRequest) as e:
            from_task_request(TaskRequest(task_id="t", instruction="x", agent={"harness": harness},
                                          evaluator=EVALUATOR), tmp_path)
        assert e.value.field == "agent.harness"
        assert str(e.value) == (f"agent.harness: {harness!r} is outside the adapters root {DEFAULT_ADAPTERS_ROOT} "
                                "(POLAR_ADAPTERS_ROOT names another)")
    with pytest.raises(BadRequest) as e:
        from_short(ShortTask(harness=str(evil), task_id="t", instruction="x", evaluator=EVALUATOR), tmp_path)
    assert e.value.field == "harness"
    with pytest.raises(BadRequest) as e:
        from_short(ShortTask(harness="pi", tasks=[{"task_id": "t", "instruction": "x", "evaluator": EVALUATOR,
                                                   "adapter": str(evil)}]), tmp_path)
    assert e.value.field == "tasks[0].adapter"
    ok = from_short(ShortTask(harness="pi.yaml", task_id="t", instruction="x", evaluator=EVALUATOR), tmp_path)
    assert ok.adapter == str(DEFAULT_ADAPTERS_ROOT / "pi.yaml")  # relative: to the adapters root
    monkeypatch.setenv("POLAR_ADAPTERS_ROOT", str(tmp_path))
    assert from_short(ShortTask(harness=str(evil), task_id="t", instruction="x", evaluator=EVALUATOR),
                      tmp_path).adapter == str(evil)


def test_a_workspace_outside_the_services_tasks_root_is_refused(tmp_path: Path):
    """What the service does with a body (workers/api/service.py): its tasks written to the batch folder, then loaded
    against the service's tasks root; `../host-secret` and `/etc` are a 422 naming `workspace`."""
    root, batch = tmp_path / "tasks", tmp_path / "batches" / "b1"
    (root / "repo").mkdir(parents=True)
    (tmp_path / "host-secret").mkdir()
    batch.mkdir(parents=True)
    for workspace, ok in (("repo", True), ("../host-secret", False), ("/etc", False)):
        sub = from_task_request(TaskRequest(task_id="t", instruction="x", agent={"harness": "pi"},
                                            evaluator=EVALUATOR, workspace=workspace), root)
        (batch / "tasks.jsonl").write_text("".join(json.dumps(t) + "\n" for t in sub.tasks))
        if ok:
            assert load_tasks(batch / "tasks.jsonl", root)[0].workspace == root / "repo"
            continue
        with pytest.raises(TaskError, match=rf":1: workspace: '.*' is outside the tasks root {root} "):
            load_tasks(batch / "tasks.jsonl", root)
