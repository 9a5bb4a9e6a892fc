"""The node's own count of running sample stages (polar/sandbox/occupancy.py): what decides whether a verifier's
timeout was the machine's, and what no sandbox process can raise."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from polar.sandbox import occupancy


def test_running_counts_held_stages_and_forgets_dead_ones(tmp_path) -> None:
    folder = tmp_path / "occ"
    assert occupancy.running(folder) == 0
    with occupancy.occupying(folder):
        with occupancy.occupying(folder):
            assert occupancy.running(folder) == 2
        assert occupancy.running(folder) == 1
    assert occupancy.running(folder) == 0 and os.listdir(folder) == []
    # a process that died inside a stage leaves its file, but no lock: not counted, and cleaned up
    code = ("import os, sys; from pathlib import Path; from polar.sandbox import occupancy\n"
            "with occupancy.occupying(Path(sys.argv[1])):\n    os._exit(0)\n")
    subprocess.run([sys.executable, "-c", code, str(folder)], check=True)
    assert len(os.listdir(folder)) == 1 and occupancy.running(folder) == 0 and os.listdir(folder) == []


def test_another_process_stage_counts(tmp_path) -> None:
    folder = tmp_path / "occ"
    code = ("import sys, time; from pathlib import Path; from polar.sandbox import occupancy\n"
            "with occupancy.occupying(Path(sys.argv[1])):\n    print('in', flush=True); sys.stdin.read()\n")
    proc = subprocess.Popen([sys.executable, "-c", code, str(folder)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "in\n"
        assert occupancy.running(folder) == 1
    finally:
        proc.communicate("")
    assert occupancy.running(folder) == 0


def test_slots_are_the_cores_unless_set(monkeypatch) -> None:
    monkeypatch.delenv("POLAR_SLOTS", raising=False)
    assert occupancy.slots() == (os.cpu_count() or 1)
    monkeypatch.setenv("POLAR_SLOTS", "7")
    assert occupancy.slots() == 7


def test_every_user_counts_in_one_folder(tmp_path) -> None:
    """A rootless `polar run` (nobody) on a node where root made the folder first registers and is counted."""
    import pytest

    if os.geteuid() != 0:
        pytest.skip("needs root to become another user")
    import shutil
    import tempfile

    base = Path(tempfile.mkdtemp(prefix="polar-occ-"))  # not under pytest's 0700 folder: nobody must reach it
    base.chmod(0o755)
    folder = base / "occ"
    with occupancy.occupying(folder):  # root makes the folder
        pass
    ready_r, ready_w = os.pipe()
    done_r, done_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: nobody, holding a stage until told to stop
        try:
            os.setgid(65534)
            os.setuid(65534)
            with occupancy.occupying(folder):
                os.write(ready_w, b"1" if occupancy.running(folder) == 1 else b"0")
                os.read(done_r, 1)
        finally:
            os._exit(0)
    try:
        assert os.read(ready_r, 1) == b"1"
        assert occupancy.running(folder) == 1  # root sees nobody's stage
    finally:
        os.write(done_w, b"x")
        os.waitpid(pid, 0)
    assert occupancy.running(folder) == 0
    shutil.rmtree(base)
