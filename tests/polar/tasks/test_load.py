"""Task files (polar/tasks/load.py): the demo tasks load; every malformed field is one line naming file, line, field."""
from __future__ import annotations

from pathlib import Path

import pytest

from polar.tasks.load import load_tasks, select_task
from polar.tasks.task import TaskError
from polar.tasks.task import DEFAULT_SUBMIT, Submit

ROOT = Path(__file__).resolve().parents[3]
DEMO = ROOT / "fixtures" / "tasks" / "tasks.yaml"

GOOD = """\
- task_id: t1
  instruction: Fix it.
  workspace: repo
  image: img
  evaluator: {command: python3 -m pytest -q}
"""


def test_demo_tasks_load() -> None:
    tasks = load_tasks(DEMO)
    assert [t.task_id for t in tasks] == ["fix-calc", "fix-greet", "fix-wordcount"]
    calc = tasks[0]
    assert calc.workspace == DEMO.parent / "calc" and (calc.tests / "tests" / "test_calc.py").is_file()
    assert not (calc.workspace / "tests").exists() and not (calc.workspace / "conftest.py").exists()  # hidden
    assert calc.submit == Submit(("calc.py",)) and calc.protected == () and calc.reward_range == (0.0, 1.0)
    assert calc.image == str((ROOT / ".cache" / "images" / "polar-tasks" / "rootfs").resolve())
    assert calc.evaluator.kind == "pytest" and calc.evaluator.pytest == ("tests/test_calc.py",)
    assert calc.evaluator.timeout_s == 60
    assert calc.timeout_s == 120 and calc.session_timeout_s > calc.timeout_s
    assert dict(calc.metadata) == {"repo": "calc", "difficulty": "trivial", "fix": "sed -i 's/a - b/a + b/' calc.py"}
    assert select_task(tasks, "fix-greet", DEMO).task_id == "fix-greet"
    with pytest.raises(TaskError, match="pick one with --task-id"):
        select_task(tasks, None, DEMO)


def test_round_trip_through_json(tmp_path: Path) -> None:
    from polar.tasks.task import TaskSpec

    for task in load_tasks(DEMO):
        assert TaskSpec.from_dict(task.to_dict()) == task


def test_jsonl_and_relative_paths(tmp_path: Path) -> None:
    (tmp_path / "repo").mkdir()
    f = tmp_path / "tasks.jsonl"
    f.write_text('{"task_id": "a", "instruction": "x", "workspace": "repo", "evaluator": {"files": {"out.txt": "hi\\n"}}}\n'
                 '\n{"task_id": "b", "instruction": "y", "evaluator": {"python": "pkg.mod:score"}, "image": "host"}\n')
    a, b = load_tasks(f)
    assert a.workspace == tmp_path / "repo" and a.image == "host" and dict(a.evaluator.files) == {"out.txt": "hi\n"}
    assert b.evaluator.python == "pkg.mod:score" and b.workspace is None


# (text replacing part of GOOD or a whole file, line, field named in the message)
BAD = [
    (GOOD.replace("task_id: t1", "task_id: -bad"), 1, "task_id"),
    (GOOD.replace("  instruction: Fix it.\n", ""), 1, "instruction"),
    (GOOD.replace("  instruction: Fix it.", "  instruction: ''"), 2, "instruction"),
    (GOOD.replace("workspace: repo", "workspace: nowhere"), 3, "workspace"),
    (GOOD + "  timeout_s: -5\n", 6, "timeout_s"),
    (GOOD + "  timeout_s: 100\n  session_timeout_s: 50\n", 7, "session_timeout_s"),
    (GOOD + "  metadata: [1, 2]\n", 6, "metadata"),
    (GOOD + "  colour: blue\n", 6, "colour"),
    (GOOD.replace("{command: python3 -m pytest -q}", "{command: x, files: {a: b}}"), 5, "evaluator"),
    (GOOD.replace("{command: python3 -m pytest -q}", "{command: x, reward: maybe}"), 5, "evaluator.reward"),
    (GOOD.replace("{command: python3 -m pytest -q}", "{python: not-a-target}"), 5, "evaluator.python"),
    (GOOD.replace("{command: python3 -m pytest -q}", "{files: {/etc/passwd: x}}"), 5, "evaluator.files"),
    (GOOD.replace("{command: python3 -m pytest -q}", "{command: x, timeout_s: 0}"), 5, "evaluator.timeout_s"),
    (GOOD + "  tests: no-such-folder\n", 6, "tests"),
    (GOOD + "  protected: conftest.py\n", 6, "protected"),
    (GOOD + "  protected: [../outside]\n", 6, "protected"),
    (GOOD + "  reward_range: [1, 0]\n", 6, "reward_range"),
    (GOOD + "  reward_range: [0, .inf]\n", 6, "reward_range"),
    (GOOD + "  reward_range: [1, 5]\n", 6, "reward_range"),
    (GOOD + "  max_calls: 0\n", 6, "max_calls"),
    (GOOD + "  submit: calc.py\n", 6, "submit"),
    (GOOD + "  submit: [/etc/passwd]\n", 6, "submit"),
    (GOOD + "  submit: {files: [a.py], binary: maybe}\n", 6, "submit.binary"),
    (GOOD + "  submit: {globs: [a.py]}\n", 6, "submit.globs"),
    (GOOD.replace("{command: python3 -m pytest -q}", "{pytest: [test_a.py]}"), 5, "evaluator.pytest"),  # no tests:
    (GOOD.replace("{command: python3 -m pytest -q}", "{pytest: []}"), 5, "evaluator.pytest"),
    (GOOD + GOOD, 6, "task_id"),  # the same id twice: the second one is named
    ("- task_id: [unclosed\n", 2, "yaml"),
]


@pytest.mark.parametrize("text,line,field", BAD, ids=[f"{b[2]}-{i}" for i, b in enumerate(BAD)])
def test_bad_task_file_names_file_line_field(tmp_path: Path, text: str, line: int, field: str) -> None:
    (tmp_path / "repo").mkdir()
    f = tmp_path / "tasks.yaml"
    f.write_text(text)
    with pytest.raises(TaskError) as err:
        load_tasks(f)
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(f"{f}:{line}: {field}: "), message


def test_submit_forms_and_the_default_with_one_warning(tmp_path: Path, capsys) -> None:
    """`submit:` as globs or a mapping; a file whose tasks lack it loads with the default and ONE warning line."""
    (tmp_path / "repo").mkdir()
    f = tmp_path / "tasks.yaml"
    f.write_text(GOOD + "  submit: {files: ['src/**/*.py'], binary: true}\n" + GOOD.replace("t1", "t2") +
                 GOOD.replace("t1", "t3"))
    t1, t2, t3 = load_tasks(f)
    assert t1.submit == Submit(("src/**/*.py",), binary=True) and t1.allowed == t1.submit
    assert t2.submit is None and t2.allowed == DEFAULT_SUBMIT == Submit(existing=True, new=True, source="default")
    warning = capsys.readouterr().err.splitlines()
    assert len(warning) == 1 and "t2, t3 declare(s) no `submit:` and ship(s) no oracle" in warning[0]
    f.write_text(GOOD + "  metadata: {fix: 'echo 1 > answer.txt'}\n" + GOOD.replace("t1", "t2"))
    t1, t2 = load_tasks(f)  # t1's oracle teaches its allowlist (polar/scoring/oracle.py): only t2 is named
    assert t1.has_oracle and not t2.has_oracle
    warning = capsys.readouterr().err.splitlines()
    assert len(warning) == 1 and ": t2 declare(s) no `submit:` and ship(s) no oracle" in warning[0]
    load_tasks(DEMO)  # every demo task declares it: no warning
    assert capsys.readouterr().err == ""


def test_a_pytest_evaluator_names_test_files_that_hold_tests(tmp_path: Path) -> None:
    (tmp_path / "repo").mkdir()
    (tmp_path / "t" / "tests").mkdir(parents=True)
    (tmp_path / "t" / "tests" / "test_a.py").write_text("def test_a():\n    pass\n")
    (tmp_path / "t" / "tests" / "helpers.py").write_text("def helper():\n    pass\n")
    f = tmp_path / "tasks.yaml"
    body = GOOD.replace("{command: python3 -m pytest -q}", "{pytest: [tests/test_a.py], timeout_s: 9}")
    f.write_text(body + "  tests: t\n  submit: [a.py]\n")
    (task,) = load_tasks(f)
    assert task.evaluator.kind == "pytest" and task.evaluator.pytest == ("tests/test_a.py",)
    f.write_text(body.replace("test_a.py", "helpers.py") + "  tests: t\n")
    with pytest.raises(TaskError, match="evaluator.pytest: tests/helpers.py: no test function"):
        load_tasks(f)


def test_bad_jsonl_line_is_named(tmp_path: Path) -> None:
    f = tmp_path / "tasks.jsonl"
    f.write_text('{"task_id": "a", "instruction": "x", "evaluator": {"command": "true"}}\n{"task_id": "b",\n')
    with pytest.raises(TaskError, match=rf"^{f}:2: json: "):
        load_tasks(f)
    f.write_text('{"task_id": "a", "instruction": "x", "evaluator": {"command": "true"}, "timeout_s": "soon"}\n')
    with pytest.raises(TaskError, match=rf"^{f}:1: timeout_s: expected a positive number"):
        load_tasks(f)


def test_polar_run_task_reports_a_bad_file_in_one_line(tmp_path: Path) -> None:
    import subprocess
    import sys

    f = tmp_path / "tasks.yaml"
    f.write_text(GOOD.replace("  workspace: repo\n", "") + "  timeout_s: soon\n")
    proc = subprocess.run([sys.executable, "-m", "polar.cli", "run", "--task", str(f), "--adapter", "pi"],
                          capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 2
    assert proc.stderr == f"polar run: {f}:5: timeout_s: expected a positive number of seconds, got 'soon'\n"
    proc = subprocess.run([sys.executable, "-m", "polar.cli", "run", "--task", str(DEMO), "--adapter", "pi"],
                          capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 2 and "pick one with --task-id (fix-calc, fix-greet, fix-wordcount)" in proc.stderr
