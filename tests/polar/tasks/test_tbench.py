"""A dataset, not a task (issue 43): fixtures/tbench, twelve task directories made as terminal-bench 2 makes them
(version 2.0, environment/Dockerfile `FROM polar-tasks:local` copying app/ to /app, workdir /app), bash, Python,
C (built with the image's tcc) and git (commit-fix: its solution commits with root's identity, configured when
the image was built; issue 66). Every task's oracle scores 1 and a do-nothing solution 0 on the container
engine: each is solvable as packaged, and none pays for no work. On Apptainer the same for one task of each kind
(each task is an image of its own, and each image's first Apptainer run exports it: ~8 s apiece here; all eleven
were run for issue 43's closing note)."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from polar.tasks.harbor import solution_of
from polar.scoring.oracle import run_oracle
from polar.tasks.load import load_tasks
from tests.polar.sandbox.test_docker import require_engine

ROOT = Path(__file__).resolve().parents[3]
DATASET = ROOT / "fixtures" / "tbench"


def test_the_dataset_reads_as_twelve_tasks_of_four_kinds():
    tasks = load_tasks(DATASET)
    assert len(tasks) == 12 and all(t.workdir == "/app" and t.image.endswith("/Dockerfile") for t in tasks)
    tags = {tag for t in tasks for tag in t.metadata["tags"]}
    assert {"bash", "python", "c", "git"} <= tags


ON_APPTAINER = ("count-errors", "word-count", "c-sum")  # bash, Python, C


@pytest.mark.slow
@pytest.mark.parametrize("runtime", ["docker", "apptainer"])
def test_every_oracle_scores_one_and_doing_nothing_zero(tmp_path, runtime):
    require_engine()  # both build the Dockerfiles with it; Apptainer runs the exported image
    idle = tmp_path / "idle" / "solve.sh"
    idle.parent.mkdir()
    idle.write_text("#!/bin/bash\ntrue\n")

    def score(task, solve, label):
        return task.task_id, label, run_oracle(task, solve, runtime, tmp_path / f"{task.task_id}-{label}",
                                               own=label == "oracle")

    tasks = [t for t in load_tasks(DATASET) if runtime == "docker" or t.task_id in ON_APPTAINER]
    with ThreadPoolExecutor(2) as pool:
        runs = [pool.submit(score, t, solution_of(DATASET, t.task_id), "oracle") for t in tasks]
        runs += [pool.submit(score, t, idle, "nothing") for t in tasks]
        table = {(task_id, label): result for task_id, label, result in (r.result() for r in runs)}
    wrong = {k: (r.exit_code, r.evaluation.reward, r.dropped, r.evaluation.output[-300:]) for k, r in table.items()
             if r.evaluation.reward != (1.0 if k[1] == "oracle" else 0.0) or r.exit_code != 0 or r.dropped}
    assert not wrong, wrong
