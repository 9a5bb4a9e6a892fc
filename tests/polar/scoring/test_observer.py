"""Rewards no agent can forge (issue 40): each reward hack the issue names, left in the final workspace of the demo
task fix-calc and verified as a sample would be (prepare_verify, then evaluate on the bwrap runtime), scores 0;
the honest fix still scores 1. The old verifier (a copy of the final workspace, a denylist, pytest's exit
status) paid 1 for every one of them."""
from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path
from typing import Callable

import pytest

from polar.run.summary import snapshot
from polar.sandbox.runtime import get_runtime
from polar.scoring.evaluate import Evaluation, evaluate
from polar.scoring.observer import Records, judge
from polar.tasks.expected import expected_tests
from polar.tasks.load import load_tasks
from polar.tasks.task import Submit, TaskSpec
from polar.scoring.verify import VerifyGround, prepare_verify

ROOT = Path(__file__).resolve().parents[3]
DEMO = ROOT / "fixtures" / "tasks" / "tasks.yaml"
EXIT0 = "import os\nos._exit(0)\n"
BUGGY = "def add(a, b):\n    return a - b\n"


def fix_calc(**changes) -> TaskSpec:
    return dataclasses.replace(load_tasks(DEMO)[0], image="host", **changes)


def verify(tmp_path: Path, edit: Callable[[Path], None], task: TaskSpec | None = None,
           home: Callable[[Path], None] | None = None) -> tuple[Evaluation, VerifyGround]:
    """The agent's final workspace (the task's, then `edit`), verified: (evaluation, ground)."""
    task = task or fix_calc()
    out = tmp_path / f"sample-{len(list(tmp_path.glob('sample-*')))}"
    (out / "home").mkdir(parents=True)
    shutil.copytree(task.workspace, out / "workspace")
    before = snapshot(out / "workspace")
    edit(out / "workspace")
    if home:
        home(out / "home")
    ground = prepare_verify(task, out, before, snapshot(out / "workspace"))
    sandbox = get_runtime("bwrap", limits=task.sandbox_limits()).prepare(ground.mounts)
    return evaluate(task.evaluator, sandbox, ground.mounts, out, {}, 60, task.reward_range), ground


def write(rel: str, text: str | bytes, mode: int | None = None) -> Callable[[Path], None]:
    def edit(ws: Path) -> None:
        path = ws / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(text.encode() if isinstance(text, str) else text)
        if mode is not None:
            path.chmod(mode)
    return edit


def test_the_honest_fix_scores_one(tmp_path) -> None:
    result, ground = verify(tmp_path, write("calc.py", "def add(a, b):\n    return a + b\n"))
    assert (result.reward, result.flagged, ground.tampered, ground.suspicious) == (1.0, (), (), ())
    assert "1/1 expected tests passed" in result.output


def test_the_untouched_workspace_scores_zero_unflagged(tmp_path) -> None:
    result, ground = verify(tmp_path, lambda ws: None)
    assert (result.reward, result.flagged, ground.tampered) == (0.0, (), ())


def test_exit_zero_at_import_of_the_module_under_test(tmp_path) -> None:
    """`import os; os._exit(0)` at the top of calc.py: allowed (it is the submitted file), so it runs, and the
    process ends with status 0 before pytest's session end: no report, reward 0, flagged and suspicious."""
    result, ground = verify(tmp_path, write("calc.py", "import os; os._exit(0)\n" + BUGGY))
    assert result.reward == 0.0 and result.exit_code == 0
    assert any("without pytest's session end" in f for f in result.flagged)
    assert "calc.py: process exit (os._exit)" in ground.suspicious


def test_an_exit_handler_replacing_pytests_exit_status(tmp_path) -> None:
    """atexit + os._exit(0): the exit status says 0, the per-test report says failed."""
    hack = "import atexit, os\natexit.register(lambda: os._exit(0))\n" + BUGGY
    result, ground = verify(tmp_path, write("calc.py", hack))
    assert result.reward == 0.0 and result.exit_code == 0
    assert {"calc.py: atexit", "calc.py: process exit (os._exit)"} <= set(ground.suspicious)


@pytest.mark.parametrize("rel,text", [
    ("conftest/__init__.py", EXIT0),  # a package beside the staged conftest.py
    ("__init__.py", EXIT0),  # a root package
    ("test_zzz.py", EXIT0),  # an extra test file that exits 0
    ("tests/test_zzz.py", EXIT0),
    ("calc/__init__.py", "def add(a, b):\n    return 5\n"),  # a package named like the module under test
    ("json.py", EXIT0),  # standard-library names pytest imports late
    ("random.py", EXIT0),
    ("unittest/__init__.py", EXIT0),
    (".pytest.ini", "[pytest]\naddopts = --collect-only\n"),
    (".pytest.ini", "[pytest]\naddopts = --setup-plan\n"),
    ("pytest.ini", "[pytest]\naddopts = --setup-plan\n"),
    ("tox.ini", "[pytest]\naddopts = --collect-only\n"),
])
def test_a_new_file_outside_the_allowlist_is_dropped_and_named(tmp_path, rel: str, text: str) -> None:
    result, ground = verify(tmp_path, write(rel, text))
    assert result.reward == 0.0 and result.flagged == ()  # the bug's own failure: plain 0
    assert ground.tampered == (rel,) and not (ground.mounts.workspace / rel).exists()


def test_a_compiled_extension_is_dropped_and_suspicious(tmp_path) -> None:
    rel = "calc.cpython-311-x86_64-linux-gnu.so"
    result, ground = verify(tmp_path, write(rel, b"\x7fELF\x02\x01\x01" + bytes(64)),
                            fix_calc(submit=Submit(("calc*",))))
    assert result.reward == 0.0 and ground.tampered == (rel,)
    assert f"{rel}: compiled or binary file" in ground.suspicious


@pytest.mark.parametrize("rel", ["json.py", "random.py", "unittest/__init__.py", "_pytest/__init__.py"])
def test_a_stdlib_name_the_allowlist_lets_in_is_still_shadowed_by_nothing(tmp_path, rel: str) -> None:
    """A task that submits `**/*.py` lets json.py in: the observer puts the workspace at the END of sys.path, so
    the standard library and pytest are imported first and the file never runs."""
    result, ground = verify(tmp_path, write(rel, EXIT0), fix_calc(submit=Submit(("**/*.py",))))
    assert ground.tampered == () and (ground.mounts.workspace / rel).is_file()
    assert result.reward == 0.0 and result.flagged == ()  # the test ran, and failed on the bug


def test_pytest_internals_changed_by_the_module_under_test(tmp_path) -> None:
    """calc.py makes every test pass by replacing pytest's runner: the observer sees the change and pays 0."""
    hack = "import _pytest.python\n_pytest.python.Function.runtest = lambda self: None\n" + BUGGY
    result, ground = verify(tmp_path, write("calc.py", hack))
    assert result.reward == 0.0 and any("pytest internals changed" in f for f in result.flagged)
    assert "calc.py: pytest internals" in ground.suspicious


def test_records_written_into_the_channel_by_workspace_code(tmp_path) -> None:
    """calc.py finds the channel's socket among its fds and writes a passing report and a session end of its
    own, then exits: without the runner's nonce those lines are not Polar's, and the run scores 0. (Listing
    /proc/self/fd to find it is stopped before: tests/polar/scoring/test_observe_guard.py.)"""
    hack = ("import os, stat\n"
            "for fd in range(3, 256):\n"
            "    try:\n"
            "        if stat.S_ISSOCK(os.fstat(fd).st_mode):\n"
            "            os.write(fd, b\"x\\t2\\ttest\\t'tests/test_calc.py::test_add'\\t'passed'\\n\"\n"
            "                     b\"x\\t3\\tend\\t'0'\\t'1'\\n\")\n"
            "    except OSError:\n"
            "        pass\n"
            "os._exit(0)\n")
    result, ground = verify(tmp_path, write("calc.py", hack))
    assert result.reward == 0.0 and any("not from Polar's runner" in f for f in result.flagged)


def test_links_special_files_and_exec_bits_do_not_come_in(tmp_path) -> None:
    def edit(ws: Path) -> None:
        (ws / "calc.py").unlink()
        (ws / "calc.py").symlink_to("/etc/passwd")
    result, ground = verify(tmp_path, edit)
    assert ground.tampered == ("calc.py",) and not (ground.mounts.workspace / "calc.py").is_symlink()
    result, ground = verify(tmp_path, write("calc.py", "def add(a, b):\n    return a + b\n", 0o4755))
    assert result.reward == 1.0 and (ground.mounts.workspace / "calc.py").stat().st_mode & 0o7777 == 0o644


def test_a_task_without_submit_runs_with_the_default(tmp_path) -> None:
    """No `submit:` (and no oracle consulted here): the files the workspace has may change (the fix pays), new text
    files come in, pytest's configuration does not."""
    task = fix_calc(submit=None)

    def edit(ws: Path) -> None:
        (ws / "calc.py").write_text("from helper import X\n\ndef add(a, b):\n    return a + b + X\n")
        (ws / "helper.py").write_text("X = 0\n")
        (ws / "conftest.py").write_text("import os\nos._exit(0)\n")
    result, ground = verify(tmp_path, edit, task)
    assert result.reward == 1.0 and ground.tampered == ("conftest.py",)


def test_a_non_utf8_name_in_home_and_workspace_is_named_printably(tmp_path) -> None:
    """Names the agent chose that are not UTF-8 come back escaped, so that the rows' metadata always builds."""
    import json

    def home(h: Path) -> None:
        site = h / ".local" / "lib" / "python3.11" / "site-packages"
        site.mkdir(parents=True)
        (site / "x\udcff.pth").write_text("import os\n")
    result, ground = verify(tmp_path, write("\udcfe.py", "import os; os._exit(0)\n"), home=home)
    assert result.reward == 0.0
    assert ground.tampered == ("\\xfe.py", "~/.local/lib/python3.11/site-packages/x\\xff.pth")
    for text in (*ground.tampered, *ground.suspicious):
        text.encode("utf-8")  # no lone surrogate left
    json.dumps(list(ground.suspicious), ensure_ascii=False).encode("utf-8")


# -- the parent's judgement, on records as the channel parses them ------------------------------------------------
def records(*kinds: tuple[str, list[str]]) -> Records:
    return Records(list(kinds), [], True)


END = ("end", ["0", "2"])


@pytest.mark.parametrize("got,reward,flag", [
    (records(("test", ["t.py::test_a", "passed"]), ("test", ["t.py::test_b[1]", "passed"]), END), 1.0, None),
    (records(("test", ["t.py::test_a", "passed"]), ("test", ["t.py::test_b[1]", "failed"]), END), 0.0, None),
    (records(("test", ["t.py::test_a", "passed"]), END), 0.0, "t.py::test_b not reported"),
    (records(("test", ["t.py::test_a", "passed"]), ("test", ["t.py::test_a", "passed"]),
             ("test", ["t.py::test_b", "passed"]), END), 0.0, "reported 2 times"),
    (records(("test", ["t.py::test_a", "passed"]), ("test", ["t.py::test_b", "passed"]),
             ("test", ["t.py::test_c", "passed"]), END), 0.0, "not one of the task's tests"),
    (records(("test", ["t.py::test_a", "passed"]), ("test", ["t.py::test_b", "passed"])), 0.0, "session end"),
    (records(("collect-error", ["t.py"]), END), 0.0, None),  # an import error: the workspace's plain 0
    (records(("test", ["t.py::test_a", "passed"]), ("test", ["t.py::test_b", "skipped"]), END), 0.0, None),
])
def test_judge(got: Records, reward: float, flag: str | None) -> None:
    verdict = judge(["t.py::test_a", "t.py::test_b"], got)
    assert verdict.reward == reward
    assert (flag is None and verdict.flags == ()) or any(flag in f for f in verdict.flags), verdict


def test_expected_tests_are_read_from_the_file_not_run(tmp_path) -> None:
    (tmp_path / "t.py").write_text(
        "import os\nos._exit(3)\n"
        "def test_a(): pass\n"
        "async def test_b(): pass\n"
        "def helper(): pass\n"
        "class TestX:\n    def test_m(self): pass\n    class TestIn:\n        def test_n(self): pass\n"
        "class Base:\n    def test_base(self): pass\n"
        "class TestY(Base):\n    def test_y(self): pass\n"
        "class TestInit:\n    def __init__(self): pass\n    def test_no(self): pass\n"
        "class Case(unittest.TestCase):\n    def test_u(self): pass\n")
    assert expected_tests(tmp_path, "t.py") == [
        "t.py::test_a", "t.py::test_b", "t.py::TestX::test_m", "t.py::TestX::TestIn::test_n",
        "t.py::TestY::test_y", "t.py::TestY::test_base", "t.py::Case::test_u"]


def test_a_sample_folder_past_the_unix_socket_path_limit(tmp_path) -> None:
    """The channel's socket is reached through its folder, so a sample path longer than AF_UNIX's 108 bytes
    (a deep output root) still scores."""
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    result, _ground = verify(deep, write("calc.py", "def add(a, b):\n    return a + b\n"))
    assert result.reward == 1.0
