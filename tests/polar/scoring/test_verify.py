"""The verify ground (polar/scoring/verify.py): the task's pristine workspace with only the agent's allowed changes,
the task's tests staged, a fresh HOME, every other change dropped and named; host reads that never follow a
link."""
from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from polar.run.summary import snapshot
from polar.tasks.load import load_tasks
from polar.tasks.task import Submit
from polar.scoring.verify import AgentFileError, AgentFileMissing, home_hooks, prepare_verify, read_beneath

ROOT = Path(__file__).resolve().parents[3]
DEMO = ROOT / "fixtures" / "tasks" / "tasks.yaml"


def sample_folder(tmp_path: Path, task) -> tuple[Path, dict[str, str]]:
    """A sample folder whose workspace started as the task's: (folder, the snapshot at the start)."""
    out = tmp_path / "sample"
    (out / "home").mkdir(parents=True)
    (out / "workspace").mkdir()
    for f in task.workspace.iterdir():
        (out / "workspace" / f.name).write_bytes(f.read_bytes())
    return out, snapshot(out / "workspace")


def test_hidden_tests_are_staged_and_the_agent_made_conftest_is_replaced(tmp_path) -> None:
    task = load_tasks(DEMO)[0]  # fix-calc: tests/calc holds conftest.py and tests/test_calc.py
    out, before = sample_folder(tmp_path, task)
    (out / "workspace" / "conftest.py").write_text("import os; os._exit(0)\n")
    (out / "workspace" / "tests").mkdir()
    (out / "workspace" / "tests" / "test_mine.py").write_text("def test_ok(): pass\n")
    (out / "workspace" / "tests" / "__pycache__").mkdir()  # a planted cache for the hidden test file
    (out / "workspace" / "tests" / "__pycache__" / "test_calc.cpython-311-pytest-7.2.1.pyc").write_bytes(b"x")
    (out / "workspace" / "calc.pyc").write_bytes(b"x")
    ground = prepare_verify(task, out, before, snapshot(out / "workspace"))
    ws = ground.mounts.workspace
    assert ground.tampered == ("calc.pyc", "conftest.py", "tests/__pycache__/test_calc.cpython-311-pytest-7.2.1.pyc",
                               "tests/test_mine.py")
    assert (ws / "conftest.py").read_text() == (task.tests / "conftest.py").read_text()
    assert (ws / "tests" / "test_calc.py").is_file() and not (ws / "tests" / "test_mine.py").exists()
    assert not (ws / "tests" / "__pycache__").exists() and not (ws / "calc.pyc").exists()
    assert (ws / "calc.py").read_text() == (task.workspace / "calc.py").read_text()
    assert ground.mounts.home != out / "home" and list(ground.mounts.home.iterdir()) == [ground.mounts.home / ".tmp"]


def test_protected_narrows_the_allowlist(tmp_path) -> None:
    task = dataclasses.replace(load_tasks(DEMO)[0], protected=("calc.py",), tests=None,
                               submit=Submit(("calc.py", "notes.txt")))
    out, before = sample_folder(tmp_path, task)
    (out / "workspace" / "calc.py").write_text("def add(a, b): return 5\n")
    (out / "workspace" / "notes.txt").write_text("mine\n")
    ground = prepare_verify(task, out, before, snapshot(out / "workspace"))
    assert ground.tampered == ("calc.py",)
    assert (ground.mounts.workspace / "calc.py").read_text() == (task.workspace / "calc.py").read_text()
    assert (ground.mounts.workspace / "notes.txt").read_text() == "mine\n"  # submitted, not protected: kept


def test_a_linked_folder_is_not_written_through(tmp_path) -> None:
    """An agent that turns tests/ into a link to a host folder gets it replaced, and nothing lands there."""
    task = load_tasks(DEMO)[0]
    out, before = sample_folder(tmp_path, task)
    host = tmp_path / "host-folder"
    host.mkdir()
    (out / "workspace" / "tests").symlink_to(host)
    ground = prepare_verify(task, out, before, snapshot(out / "workspace"))
    assert "tests" in ground.tampered
    assert not (ground.mounts.workspace / "tests").is_symlink() and list(host.iterdir()) == []


def test_what_cannot_be_copied_is_left_out(tmp_path) -> None:
    """A FIFO or a socket in the final workspace (a copy would block or fail) is not the host's failure."""
    import socket

    task = load_tasks(DEMO)[0]
    out, before = sample_folder(tmp_path, task)
    os.mkfifo(out / "workspace" / "pipe")
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(out / "workspace" / "sock"))
        ground = prepare_verify(task, out, before, snapshot(out / "workspace"))
    names = sorted(p.name for p in ground.mounts.workspace.iterdir())
    assert names == ["calc.py", "conftest.py", "tests"]


@pytest.mark.parametrize("submit", [None, Submit(("*.bin",), binary=True)])
def test_a_64_gib_sparse_file_is_never_copied(tmp_path, submit) -> None:
    """A 64 GiB sparse file the agent leaves costs the verify stage nothing: outside the allowlist it is dropped
    unread, inside it it is past allow.FILE_LIMIT and dropped all the same."""
    import time

    task = dataclasses.replace(load_tasks(DEMO)[0], submit=submit)
    out, before = sample_folder(tmp_path, task)
    with open(out / "workspace" / "big.bin", "wb") as f:
        f.truncate(64 * 2**30)
        f.seek(2**30)
        f.write(b"data in the middle")
    start = time.monotonic()
    ground = prepare_verify(task, out, before, snapshot(out / "workspace"))
    assert time.monotonic() - start < 10
    assert ground.tampered == ("big.bin",) and not (ground.mounts.workspace / "big.bin").exists()


def test_home_hooks_are_named(tmp_path) -> None:
    site = tmp_path / ".local" / "lib" / "python3.11" / "site-packages"
    site.mkdir(parents=True)
    (site / "usercustomize.py").write_text("import os; os._exit(0)\n")
    (site / "evil.pth").write_text("import os\n")
    (tmp_path / ".config").mkdir()
    (tmp_path / ".config" / "settings.json").write_text("{}")
    assert home_hooks(tmp_path) == [".local/lib/python3.11/site-packages/evil.pth",
                                    ".local/lib/python3.11/site-packages/usercustomize.py"]


def test_read_beneath_refuses_links_and_special_files(tmp_path) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "r.txt").write_text("0.5\n")
    assert read_beneath(tmp_path, "d/r.txt") == b"0.5\n"
    (tmp_path / "to-host").symlink_to("/proc/sys/kernel/pid_max")
    (tmp_path / "via").symlink_to(tmp_path / "d")
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "big").write_bytes(b"1" * 100)
    for rel in ("to-host", "via/r.txt", "fifo", "../etc/passwd", "/etc/passwd"):
        with pytest.raises(AgentFileError):
            read_beneath(tmp_path, rel)
    with pytest.raises(AgentFileError, match="larger than 10 bytes"):
        read_beneath(tmp_path, "big", limit=10)
    with pytest.raises(AgentFileMissing):
        read_beneath(tmp_path, "d/none.txt")
