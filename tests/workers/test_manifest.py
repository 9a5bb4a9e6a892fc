"""workers.manifest: a batch's samples, ids under the id rule, written whole."""
from __future__ import annotations

from pathlib import Path

import pytest

from polar_traj.records import check_id
from workers.manifest import plan, read_manifest, write_manifest


def test_plan_groups_and_ids(tmp_path: Path):
    m = plan("b1", tmp_path / "b1", tmp_path / "tasks.yaml", ["fix-a", "fix-b"], 3)
    assert m.groups == ["b1.fix-a", "b1.fix-b"]
    assert [s.sample_id for s in m.group("b1.fix-b")] == ["b1.fix-b.0", "b1.fix-b.1", "b1.fix-b.2"]
    assert read_manifest(write_manifest(m)) == m
    assert not list((tmp_path / "b1").glob(".*"))  # no temp file left behind


def test_long_task_ids_stay_valid_and_distinct(tmp_path: Path):
    ids = ["t" * 127 + "a", "t" * 127 + "b"]
    m = plan("b1", tmp_path, tmp_path / "t.yaml", ids, 2)
    assert len(set(m.groups)) == 2
    for s in m.samples:
        check_id(s.sample_id, "sample_id")


@pytest.mark.parametrize("kwargs, message", [
    (dict(task_ids=["a", "a"]), "repeated: a"),
    (dict(task_ids=[]), "no tasks"),
    (dict(group_size=0), "group size 0"),
    (dict(min_groups=3), "min_groups 3"),
    (dict(task_ids=["../x"]), "task_id"),
])
def test_plan_refuses(tmp_path: Path, kwargs, message):
    args = dict(task_ids=["a", "b"], group_size=2, min_groups=None)
    args.update(kwargs)
    with pytest.raises(ValueError, match=message):
        plan("b1", tmp_path, tmp_path / "t.yaml", args["task_ids"], args["group_size"], min_groups=args["min_groups"])


def test_plan_keeps_the_batchs_sampling(tmp_path: Path):
    m = plan("b1", tmp_path / "b1", tmp_path / "t.yaml", ["a"], 2, sampling={"temperature": 0.7, "top_k": None})
    assert m.sampling == {"temperature": 0.7}
    assert read_manifest(write_manifest(m)).sampling == {"temperature": 0.7}
    assert plan("b1", tmp_path, tmp_path / "t.yaml", ["a"], 2).sampling is None
    with pytest.raises(ValueError, match="sampling temperature"):
        plan("b1", tmp_path, tmp_path / "t.yaml", ["a"], 2, sampling={"temperature": -1})
