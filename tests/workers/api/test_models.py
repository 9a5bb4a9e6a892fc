"""workers/api/models.py and callbacks.signature/verify without a server: how a TaskRequest and the short form map onto
a batch, what is refused with the field named, and the callback signature a trainer checks."""
from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from workers.api.callbacks import signature, verify
from workers.api.metrics import stage_durations
from workers.api.models import BadRequest, ShortTask, TaskRequest, from_short, from_task_request

EVALUATOR = {"command": "true"}


def test_task_request_maps_onto_a_batch(tmp_path: Path):
    body = TaskRequest(task_id="t1", instruction="Fix it.", num_samples=3, timeout_seconds=90, runtime="bwrap",
                       agent={"harness": "pi", "model_name": "m"}, evaluator=EVALUATOR, workspace="repo",
                       callback_url="http://127.0.0.1:9/cb", metadata={"k": 1})
    sub = from_task_request(body, tmp_path)
    assert (sub.group_size, sub.adapter, sub.callback_url, sub.samples) == (3, "pi", "http://127.0.0.1:9/cb", 3)
    assert sub.strategy == "prefix_merge"  # Polar's rollout server's prefix_merging
    assert sub.tasks == [{"task_id": "t1", "instruction": "Fix it.", "evaluator": EVALUATOR,
                          "workspace": str(tmp_path / "repo"), "image": "host", "timeout_s": 90,
                          "metadata": {"k": 1, "model_name": "m"}}]


def test_refusals_name_the_field(tmp_path: Path):
    with pytest.raises(ValidationError) as e:
        TaskRequest(task_id="t", instruction="x", agent={"harness": "pi"}, evaluator=EVALUATOR, num_sample=2)
    assert e.value.errors()[0]["loc"] == ("num_sample",)
    env = TaskRequest(task_id="t", instruction="x", agent={"harness": "pi", "env": {"A": "1"}}, evaluator=EVALUATOR)
    with pytest.raises(BadRequest, match="agent.env"):
        from_task_request(env, tmp_path)
    with pytest.raises(BadRequest) as b:
        from_short(ShortTask(harness="pi", task_id="t", instruction="x"), tmp_path)
    assert b.value.field == "evaluator"
    with pytest.raises(ValidationError):
        ShortTask(harness="pi", callback_url="ftp://x")


def test_short_form_with_tasks(tmp_path: Path):
    body = ShortTask(harness="codex", runtime="apptainer", group_size=2,
                     tasks=[{"task_id": "a", "instruction": "x", "evaluator": EVALUATOR, "image": "/img.sif"},
                            {"task_id": "b", "instruction": "y", "evaluator": EVALUATOR, "image": "/img.sif"}])
    sub = from_short(body, tmp_path)
    assert sub.strategy == "prefix_merge"
    per_request = TaskRequest(task_id="t", instruction="x", agent={"harness": "pi"}, evaluator=EVALUATOR,
                              builder={"strategy": "per_request"})
    assert from_task_request(per_request, tmp_path).strategy == "per_request"
    assert from_short(ShortTask(harness="pi", trajectory_strategy="per_request", **body.tasks[0].model_dump(
        exclude_none=True)), tmp_path).strategy == "per_request"
    assert sub.samples == 4 and [t["task_id"] for t in sub.tasks] == ["a", "b"] and sub.adapter == "codex"


def test_a_harbor_folder_under_the_tasks_root(tmp_path: Path):
    import shutil

    root = tmp_path / "root"
    shutil.copytree(Path(__file__).resolve().parents[3] / "fixtures" / "harbor", root / "harbor")
    sub = from_short(ShortTask(harness="pi", harbor="harbor", group_size=2), root)
    assert (sub.folder, sub.samples, sub.adapter) == (root / "harbor", 6, "pi")
    assert sorted(t["task_id"] for t in sub.tasks) == ["count-lines", "fix-mul", "write-hello"]
    for body, why in ((ShortTask(harness="pi", harbor=str(tmp_path)), "outside the service's tasks root"),
                      (ShortTask(harness="pi", harbor="missing"), "no such folder"),
                      (ShortTask(harness="pi", harbor="harbor", task_id="t"), "one of them")):
        with pytest.raises(BadRequest, match=why) as e:
            from_short(body, root)
        assert e.value.field == "harbor"


def test_signature():
    body = b'{"event": "sample"}'
    header = signature("s3cret", "1000", "b1", body)
    assert header.startswith("sha256=") and len(header) == 7 + 64
    sent = {"X-Polar-Signature": header, "X-Polar-Timestamp": "1000", "X-Polar-Batch": "b1"}
    assert verify("s3cret", sent, body, now=1000)
    assert not verify("s3cret", sent, body + b" ", now=1000) and not verify("other", sent, body, now=1000)
    assert not verify("s3cret", {**sent, "X-Polar-Batch": "b2"}, body, now=1000)  # another batch's delivery
    assert not verify("s3cret", sent, body, now=1000 + 301)  # replayed outside the window
    assert not verify("s3cret", {k: v for k, v in sent.items() if k != "X-Polar-Signature"}, body, now=1000)


def test_stage_durations():
    spent = stage_durations([{"t_queued": 0.0, "t_prepare": 1.0, "t_run": 3.0, "t_postrun": 7.0, "t_done": 8.0},
                             {"t_queued": 0.0, "t_prepare": 2.0, "stage": "prepare"}])
    assert spent == {"queued": [1.0, 2.0], "prepare": [2.0], "run": [4.0], "postrun": [1.0]}


def test_polar_api_needs_a_token(monkeypatch, capsys):
    from polar.cli import main

    monkeypatch.delenv("POLAR_API_TOKEN", raising=False)
    assert main(["api", "--port", "1"]) == 2
    assert capsys.readouterr().err.strip() == ("polar api: set POLAR_API_TOKEN to a secret of 16 characters or more "
                                               "(every endpoint but /health needs it as a bearer token)")
    monkeypatch.setenv("POLAR_API_TOKEN", "t" * 16)
    assert main(["api", "--max-samples", "0"]) == 2
    assert capsys.readouterr().err.strip() == "polar api: --max-samples: expected more than 0, got 0"


def test_a_bodys_runtime_is_honoured_or_refused(tmp_path: Path):
    """`"runtime": "docker"` without an image once ran in bwrap (image host, silently): now the demo task image,
    which a node's runtime auto runs in the container engine; apptainer without an image and an unknown runtime
    are refused naming the field."""
    from polar.sandbox.runtime import names_oci_image

    docker = from_short(ShortTask(harness="pi", runtime="docker", task_id="t", instruction="x", evaluator=EVALUATOR),
                        tmp_path)
    assert docker.tasks[0]["image"] == "polar-tasks:local" and names_oci_image(docker.tasks[0]["image"])
    request = TaskRequest(task_id="t", instruction="x", agent={"harness": "pi"}, evaluator=EVALUATOR, runtime="docker")
    assert from_task_request(request, tmp_path).tasks[0]["image"] == "polar-tasks:local"
    own = from_short(ShortTask(harness="pi", runtime="docker", task_id="t", instruction="x", evaluator=EVALUATOR,
                               image="docker://debian:12"), tmp_path)
    assert own.tasks[0]["image"] == "docker://debian:12"
    for runtime, field, line in [
            ("apptainer", "image", "image: runtime apptainer needs the task's image (a SIF or sandbox directory); "
                                   "only docker has a default (polar-tasks:local)"),
            ("kubernetes", "runtime", "runtime: 'kubernetes': expected one of auto, bwrap, local, apptainer, docker")]:
        with pytest.raises(BadRequest) as e:
            from_short(ShortTask(harness="pi", runtime=runtime, task_id="t", instruction="x", evaluator=EVALUATOR),
                       tmp_path)
        assert (e.value.field, str(e.value)) == (field, line)
