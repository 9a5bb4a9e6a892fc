"""Multi-step Harbor tasks (issue 43, polar/tasks/steps.py, polar/run/multistep.py): fixtures/harbor-steps read as
Harbor reads it; each step's pristine ground and tests; step files put into a workspace the agent shaped without
following its links; the oracle step by step on bwrap and Apptainer; pi through every step in one workspace
(bwrap, and one Apptainer instance for all steps), scripted by fixtures/policies/harbor.yaml: the rows carry
their step, the reward is the steps' mean, a step under its min_reward stops the task, and a failing setup.sh is
the environment's only before the agent did anything."""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from polar.tasks.harbor import load_harbor
from polar.tasks.task import TaskError, TaskSpec
from polar.tasks.steps import below_floor, put_step_files, step_session_id, step_task, task_reward, untouched_before
from polar_traj import read as read_trajectories
from tests.polar.sandbox.test_apptainer import demo_image
from tests.polar.tasks.test_harbor import POLICY, polar, polar_run, result_of

ROOT = Path(__file__).resolve().parents[3]
STEPS = ROOT / "fixtures" / "harbor-steps"
TASK = "name-then-greet"


def task_copy(tmp: Path, files: dict[str, str | None] | None = None) -> Path:
    """The fixture task copied under tmp/tasks, with some of its files replaced (None: removed)."""
    dest = tmp / "tasks" / TASK
    shutil.copytree(STEPS / TASK, dest)
    for rel, text in (files or {}).items():
        if text is None:
            (dest / rel).unlink()
        else:
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            (dest / rel).write_text(text)
    return dest


# -- reading ------------------------------------------------------------------------------------------------------
def test_the_fixture_reads_as_two_steps(tmp_path, monkeypatch):
    monkeypatch.setenv("POLAR_STEP_CACHE", str(tmp_path / "cache"))
    [task] = load_harbor(STEPS / TASK)
    first, second = task.steps
    assert (task.task_id, task.step_reward, [s.name for s in task.steps]) == (TASK, "mean", ["write-name", "greet"])
    assert task.instruction == first.instruction and "name.txt" in first.instruction
    assert (first.min_reward, second.min_reward, dict(second.verifier_env)) == (1.0, None, {"GREETING": "hello"})
    assert first.files is None and second.files.name == "workdir" and "steps.log" in second.setup
    assert task.session_timeout_s >= first.timeout_s + second.timeout_s + 2 * first.verify_timeout_s
    assert TaskSpec.from_dict(json.loads(json.dumps(task.to_dict()))) == task
    # Each step's ground: the task's files and what the steps so far shipped (setup.sh never), tests over tests.
    one, two = step_task(task, 0), step_task(task, 1)
    assert one.workspace is None and sorted(os.listdir(two.workspace)) == ["template.txt"]
    assert sorted(os.listdir(one.tests)) == sorted(os.listdir(two.tests)) == ["lib.sh", "test.sh"]
    assert "expect name.txt" in (one.tests / "test.sh").read_text()
    assert "expect greeting.txt" in (two.tests / "test.sh").read_text()
    assert (two.instruction, two.evaluator.env["GREETING"], two.steps) == (second.instruction, "hello", ())
    assert step_task(task, 1).workspace == two.workspace  # built once per content: the pre-check is cached too


def test_a_steps_test_sh_wins_over_the_tasks(tmp_path, monkeypatch):
    monkeypatch.setenv("POLAR_STEP_CACHE", str(tmp_path / "cache"))
    task_dir = task_copy(tmp_path, {"tests/test.sh": "echo 0 > /logs/verifier/reward.txt\n",
                                    "steps/write-name/tests/test.sh": None})
    [task] = load_harbor(task_dir)
    assert "echo 0" in (step_task(task, 0).tests / "test.sh").read_text()  # the task's: the step has none
    assert "expect greeting.txt" in (step_task(task, 1).tests / "test.sh").read_text()


@pytest.mark.parametrize("files, key, message", [
    ({"task.toml": 'steps = []\n'}, "steps", "expected one or more [[steps]] tables"),
    ({"task.toml": '[[steps]]\nname = "write-name"\n[[steps]]\nname = "write-name"\n'}, "steps[1].name",
     "'write-name' is the name of an earlier step"),
    ({"task.toml": '[[steps]]\nname = "../x"\n'}, "steps[0].name", "the step's name '../x' is not a valid id"),
    ({"task.toml": 'multi_step_reward_strategy = "max"\n[[steps]]\nname = "write-name"\n'},
     "multi_step_reward_strategy", "expected one of mean, final, got 'max'"),
    ({"task.toml": '[[steps]]\nname = "write-name"\nmin_reward = "high"\n'}, "steps[0].min_reward",
     "expected a number or a table of named rewards"),
    ({"task.toml": '[[steps]]\nname = "write-name"\n[steps.agent]\ntimeout_sec = -1\n'},
     "steps[0].agent.timeout_sec", "expected a positive number of seconds"),
    ({"task.toml": '[[steps]]\nname = "write-name"\n[steps.verifier]\nenv = { "1X" = "a" }\n'},
     "steps[0].verifier.env", "1X = 'a': expected NAME"),
])
def test_a_malformed_step_is_one_line_naming_file_and_key(tmp_path, files, key, message):
    task_dir = task_copy(tmp_path, files)
    with pytest.raises(TaskError) as e:
        load_harbor(task_dir)
    assert str(e.value).startswith(f"{task_dir / 'task.toml'}: {key}: {message}"), e.value


@pytest.mark.parametrize("remove, where, message", [
    ("steps/greet/instruction.md", "steps/greet/instruction.md", "instruction: missing"),
    ("steps/greet/tests/test.sh", "tests/test.sh", "tests: missing, and not every step has"),
])
def test_a_step_missing_a_file_is_named(tmp_path, remove, where, message):
    task_dir = task_copy(tmp_path, {remove: None})
    with pytest.raises(TaskError) as e:
        load_harbor(task_dir)
    assert str(e.value).startswith(f"{task_dir / where}: {message}"), e.value


def test_a_step_without_its_folder_is_named(tmp_path):
    task_dir = task_copy(tmp_path)
    shutil.rmtree(task_dir / "steps" / "greet")
    with pytest.raises(TaskError, match=r"steps/greet: steps\[1\]: the step's folder is missing"):
        load_harbor(task_dir)


# -- the pieces ---------------------------------------------------------------------------------------------------
def test_step_files_never_go_through_the_agents_links(tmp_path):
    """The agent may leave links where a step's files go (its processes may still run): they are replaced, and
    nothing outside the workspace is written."""
    [task] = load_harbor(STEPS / TASK)
    outside, workspace = tmp_path / "outside", tmp_path / "workspace"
    outside.mkdir()
    (outside / "target").write_text("host file\n")
    workspace.mkdir()
    (workspace / "template.txt").symlink_to(outside / "target")
    files = tmp_path / "files"
    (files / "sub").mkdir(parents=True)
    (files / "sub" / "data.txt").write_text("data\n")
    (files / "setup.sh").write_text("echo hi\n")
    (workspace / "sub").symlink_to(outside)  # a link where the step's folder goes
    step = task.steps[1]
    assert put_step_files(step, workspace) == ["template.txt"]
    assert (workspace / "template.txt").read_text() == "hello, NAME\n" and not (workspace / "template.txt").is_symlink()
    put_step_files(dataclasses.replace(step, files=files), workspace)
    assert not (workspace / "sub").is_symlink() and (workspace / "sub" / "data.txt").read_text() == "data\n"
    assert not (workspace / "setup.sh").exists()  # the hook runs; it is never the workspace's
    assert sorted(os.listdir(outside)) == ["target"] and (outside / "target").read_text() == "host file\n"


def test_the_steps_rewards_make_the_samples():
    assert task_reward("mean", [1.0, 0.0], 2) == 0.5
    assert task_reward("mean", [1.0], 3) == pytest.approx(1 / 3)  # steps that did not run count 0
    assert task_reward("mean", [None, 1.0], 2) == 0.5
    assert task_reward("final", [0.0, 0.75], 2) == 0.75
    assert task_reward("final", [1.0], 2) == 0.0  # stopped before the final step
    [task] = load_harbor(STEPS / TASK)
    first = task.steps[0]
    assert below_floor(first, 1.0, None) is None and "below its min_reward 1" in below_floor(first, 0.5, None)
    named = dataclasses.replace(first, min_reward={"safety": 1.0})
    assert below_floor(named, 0.0, {"safety": 1.0}) is None
    assert "safety 0 < 1" in below_floor(named, 1.0, {"other": 1.0})  # a floor's reward not written counts 0


def test_what_the_host_changed_before_each_step_is_not_the_agents():
    """A step's files and its harness's config (written before its harness) are left out of the allowlist's
    count when alike at the end; what the agent changed in an earlier step stays the agent's."""
    start1 = {"task.py": "t0", ".harness": "h1"}
    end1 = {"task.py": "agent", ".harness": "h1", "notes.md": "n"}
    start2 = {"task.py": "agent", ".harness": "h2", "notes.md": "n", "template.txt": "shipped"}
    after = {"task.py": "agent", ".harness": "h2", "notes.md": "n", "template.txt": "shipped", "out.txt": "o"}
    kept = untouched_before([start1, start2], [end1, after], after)
    assert kept == {".harness": "h2", "template.txt": "shipped"}
    assert step_session_id("s-1", 1) == "s-1.s2" and len(step_session_id("x" * 128, 0)) <= 128


# -- the oracle ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("runtime", ["bwrap", "apptainer"])
def test_the_oracle_solves_each_step_in_one_workspace(tmp_path, runtime):
    image = ["--image", str(demo_image())] if runtime == "apptainer" else []
    done = polar("run", "--task", str(STEPS / TASK), "--oracle", "--runtime", runtime, *image,
                 "--out", str(tmp_path / "o"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"({runtime}): solve.sh exit 0, reward 1" in done.stdout
    assert "step 1 write-name: solve.sh exit 0, reward 1" in done.stdout
    assert "step 2 greet: solve.sh exit 0, reward 1" in done.stdout
    workspace = tmp_path / "o" / "workspace"
    assert (workspace / "steps.log").read_text() == "greet\n" and not (workspace / "setup.sh").exists()


def test_an_oracle_failing_the_first_step_stops_the_task(tmp_path):
    task_dir = task_copy(tmp_path, {"steps/write-name/solution/solve.sh": "true\n"})
    done = polar("run", "--task", str(task_dir), "--oracle", "--runtime", "bwrap", "--out", str(tmp_path / "o"))
    assert done.returncode == 1, done.stdout + done.stderr
    assert "reward 0" in done.stdout and "below its min_reward 1" in done.stdout, done.stdout
    assert "step 2" not in done.stdout and not (tmp_path / "o" / "workspace" / "template.txt").exists()


# -- through a harness --------------------------------------------------------------------------------------------
UNKNOWN = "Do something no policy rule knows.\n"
RUNS = {"both": {}, "first-only": {"steps/greet/instruction.md": UNKNOWN},
        "none": {"steps/write-name/instruction.md": UNKNOWN},
        "setup-fails-later": {"steps/greet/workdir/setup.sh": "echo broken >&2; exit 3\n"},
        "setup-fails-first": {"steps/write-name/workdir/setup.sh": "exit 4\n"}, "apptainer": {}}


@pytest.fixture(scope="module")
def runs(tmp_path_factory, long_model) -> dict[str, tuple[Path, str]]:
    tmp = tmp_path_factory.mktemp("steps")

    def one(label: str) -> tuple[Path, str]:
        task_dir = task_copy(tmp / label, RUNS[label])
        if label != "apptainer":
            return polar_run(tmp, task_dir, TASK, "pi", label, long_model)
        out = tmp / f"{TASK}-{label}"  # one instance for every step: files put and setup.sh run while it lives
        done = polar("run", "--task", str(task_dir), "--adapter", "pi", "--runtime", "apptainer", "--image",
                     str(demo_image()), "--policy", str(POLICY), "--model", str(long_model), "--out", str(out),
                     "--confdir", str(tmp / f"mitm-{label}"), timeout=600)
        return out, done.stdout + done.stderr

    with ThreadPoolExecutor(3) as pool:
        return dict(zip(RUNS, pool.map(one, RUNS)))


@pytest.mark.slow
@pytest.mark.parametrize("label", ["both", "apptainer"])
def test_pi_works_through_both_steps_and_the_rows_carry_them(runs, label):
    out, printed = runs[label]
    result = result_of(out, printed)
    assert (result.status, result.failure, result.reward, result.weight) == ("completed", None, 1.0, 1.0), printed
    assert [(s["name"], s["reward"], s["ran"]) for s in result.steps] == [("write-name", 1.0, True),
                                                                          ("greet", 1.0, True)]
    assert "step 1 write-name: reward 1" in printed and "step 2 greet: reward 1" in printed
    assert sorted(Path(f).stem.rsplit(".", 1)[1] for f in result.capture_files) == ["s1", "s2"]
    rows = read_trajectories(result.trajectories).to_pylist()
    steps = {json.loads(r["metadata"])["task"]["step"] for r in rows}
    assert steps == {"write-name", "greet"} and all(r["reward"] == 1.0 for r in rows)
    assert {r["session_id"].rsplit(".", 1)[1] for r in rows} == {"s1", "s2"}
    workspace = out / "workspace"
    assert (workspace / "greeting.txt").read_text() == "hello, polar\n"  # step 2 built on step 1's file
    assert (workspace / "steps.log").read_text() == "greet\n" and not (workspace / "setup.sh").exists()
    for n, name in ((1, "write-name"), (2, "greet")):
        assert (out / "steps" / f"{n}-{name}" / "harness.json").is_file()
    assert result.tampered == [], result.tampered


@pytest.mark.slow
def test_a_step_left_undone_scores_zero_in_the_mean(runs):
    out, printed = runs["first-only"]
    result = result_of(out, printed)
    assert (result.status, result.reward) == ("completed", 0.5), printed
    assert [s["reward"] for s in result.steps] == [1.0, 0.0]


@pytest.mark.slow
def test_a_step_under_its_min_reward_stops_the_task(runs):
    out, printed = runs["none"]
    result = result_of(out, printed)
    assert (result.status, result.reward) == ("completed", 0.0), printed
    assert [(s["reward"], s["ran"]) for s in result.steps] == [(0.0, True), (None, False)]
    assert "below its min_reward 1" in result.steps[0]["stopped"] and "step 2 greet: not run" in printed
    assert [Path(f).stem.rsplit(".", 1)[1] for f in result.capture_files] == ["s1"]  # step 2's harness never ran
    assert not (out / "workspace" / "template.txt").exists()


@pytest.mark.slow
def test_a_failing_setup_is_the_environments_only_before_the_agent(runs):
    """On the first step nothing of the agent's is there yet: a failing setup.sh is the environment's (masked).
    On a later step the agent's earlier work shaped what it runs on: the step scores 0 and says so."""
    out, printed = runs["setup-fails-first"]
    result = result_of(out, printed)
    assert (result.status, result.failure, result.weight) == ("error", "infrastructure", 0.0), printed
    assert "step write-name: setup.sh exited 4" in result.reason and result.calls == 0
    out, printed = runs["setup-fails-later"]
    result = result_of(out, printed)
    assert (result.status, result.failure, result.reward) == ("completed", None, 0.5), printed
    assert "setup.sh exited 3: broken" in result.steps[1]["stopped"] and result.steps[1]["reward"] == 0.0
    assert any("step greet: its setup.sh exited 3" in s for s in result.suspicious), result.suspicious
    assert [Path(f).stem.rsplit(".", 1)[1] for f in result.capture_files] == ["s1"]
