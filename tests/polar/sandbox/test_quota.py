"""The per-sample disk quota (issue 43, polar/sandbox/quota.py): a loop-mounted ext4 of the task's storage_mb
under HOME and the workspace. Writing past it is ENOSPC and costs the host no more than the quota; the sample
completes with the task's reward (0 here); afterwards the sample folder holds what the agent left, as without a
quota. The disk is a real loop mount: these tests need root and loop devices, as `make test` has here."""
from __future__ import annotations

import errno
import json
import os
import shutil
import stat
from pathlib import Path

import pytest

from polar.sandbox import quota
from tests.polar.tasks.test_harbor import HARBOR, POLICY, polar, result_of

QUOTA_MB = 32


@pytest.fixture(autouse=True)
def can_mount():
    why = quota.unavailable()
    if why:
        pytest.fail(f"no disk quota on this machine: {why} (make test runs as root with loop devices)")


def allocated(path: Path) -> int:
    """Bytes the host's own filesystem holds under `path` (a disk's file counted, not what is mounted from it)."""
    total = 0
    for d, dirs, files in os.walk(path):
        dirs[:] = [x for x in dirs if not os.path.ismount(os.path.join(d, x))]
        total += sum(os.lstat(os.path.join(d, f)).st_blocks * 512 for f in files)
    return total


def test_a_disk_refuses_writes_past_its_size_and_gives_them_back(tmp_path):
    disk, target = tmp_path / ".disk", tmp_path / "workspace"
    quota.make_disk(disk, QUOTA_MB, (("workspace", target),))
    try:
        assert os.path.ismount(target) and os.listdir(target) == []  # no lost+found in the workspace
        with pytest.raises(OSError) as e, open(target / "big.bin", "wb") as f:
            for _ in range(2 * QUOTA_MB):
                f.write(b"\0" * (1 << 20))
                f.flush()
        assert e.value.errno == errno.ENOSPC
        os.symlink("/etc/passwd", target / "link")
        (target / "tool").write_text("#!/bin/sh\n")
        os.chmod(target / "tool", 0o4755)
        assert allocated(tmp_path) <= (QUOTA_MB + 8) << 20  # the host holds the file's written blocks only
    finally:
        quota.remove_disk(disk, (("workspace", target),))
    assert not os.path.ismount(target) and not disk.exists() and not quota.image_of(disk).exists()
    kept = (target / "big.bin").stat().st_size
    assert (QUOTA_MB - 8) << 20 < kept < QUOTA_MB << 20  # what fitted, copied back
    assert os.readlink(target / "link") == "/etc/passwd"  # a link stays a link, never followed
    assert (target / "tool").stat().st_mode & 0o7777 == 0o755  # no setuid bit comes back


def loops_backed_by(folder: Path) -> list[str]:
    """Loop devices whose file lies under `folder`."""
    found = []
    for f in Path("/sys/block").glob("loop*/loop/backing_file"):
        try:
            if f.read_text().strip().startswith(str(folder)):
                found.append(f.parent.parent.name)
        except OSError:
            pass  # detached meanwhile
    return found


def test_disks_of_one_size_are_each_a_fresh_filesystem_and_leave_no_loop_device(tmp_path):
    """The second disk of a size is written from the first's format, not by mkfs: it must still be an empty
    filesystem of its own, usable beside the first (same ext4 UUID), bounded the same, and each disk's loop
    device must go with its unmount."""
    disks = [(tmp_path / f"s{k}" / ".disk", tmp_path / f"s{k}" / "workspace") for k in range(3)]
    for disk, target in disks:
        quota.make_disk(disk, QUOTA_MB, (("workspace", target),))
    try:
        assert len(loops_backed_by(tmp_path)) == 3
        for k, (_disk, target) in enumerate(disks):
            assert os.listdir(target) == []  # nothing of another disk
            (target / "mine").write_text(str(k))
        for k, (_disk, target) in enumerate(disks):
            assert (target / "mine").read_text() == str(k)
        os.symlink("/etc/passwd", disks[0][1] / "link")  # a small tree: copied back in-process
        (disks[0][1] / "tool").write_text("#!/bin/sh\n")
        os.chmod(disks[0][1] / "tool", 0o4755)
        os.mkfifo(disks[1][1] / "pipe")  # a fifo: copied back by cp
        with pytest.raises(OSError) as e, open(disks[2][1] / "big.bin", "wb") as f:
            for _ in range(2 * QUOTA_MB):
                f.write(b"\0" * (1 << 20))
                f.flush()
        assert e.value.errno == errno.ENOSPC
    finally:
        for disk, target in disks:
            quota.remove_disk(disk, (("workspace", target),))
    assert loops_backed_by(tmp_path) == []
    assert [(t / "mine").read_text() for _d, t in disks] == ["0", "1", "2"]
    assert os.readlink(disks[0][1] / "link") == "/etc/passwd"
    assert (disks[0][1] / "tool").stat().st_mode & 0o7777 == 0o755
    assert stat.S_ISFIFO((disks[1][1] / "pipe").lstat().st_mode)


def test_the_node_default(monkeypatch):
    monkeypatch.delenv(quota.DEFAULT_ENV, raising=False)
    assert quota.quota_mb(None) == quota.DEFAULT_MB and quota.quota_mb(64) == 64 and quota.quota_mb(1) == quota.MIN_MB
    monkeypatch.setenv(quota.DEFAULT_ENV, "0")
    assert quota.quota_mb(None) is None and quota.quota_mb(64) == 64
    monkeypatch.setenv(quota.DEFAULT_ENV, "lots")
    with pytest.raises(quota.QuotaError, match="POLAR_STORAGE_MB='lots': expected a number of megabytes"):
        quota.quota_mb(None)


@pytest.mark.slow
def test_an_agent_writing_past_storage_mb_gets_enospc_and_the_sample_completes(tmp_path, long_model):
    task = tmp_path / "tasks" / "fill-disk"
    shutil.copytree(HARBOR / "write-hello", task)
    (task / "instruction.md").write_text("Fill the disk with 64 MB in big.bin.\n")
    (task / "task.toml").write_text(f'version = "2.0"\n[environment]\nstorage_mb = {QUOTA_MB}\n'
                                    '[polar]\nsubmit = ["big.bin", "wrote.txt"]\n')
    (task / "tests" / "test.sh").write_text('[ "$(stat -c %s big.bin)" -ge 67108864 ] && '
                                            'echo 1 > /logs/verifier/reward.txt\n')
    out = tmp_path / "out"
    done = polar("run", "--task", str(task), "--adapter", "pi", "--runtime", "bwrap", "--policy", str(POLICY),
                 "--model", str(long_model), "--out", str(out), "--confdir", str(tmp_path / "mitm"), timeout=600)
    result = result_of(out, done.stdout + done.stderr)
    assert (result.status, result.failure, result.reward) == ("completed", None, 0.0), done.stdout + done.stderr
    assert (out / "workspace" / "wrote.txt").read_text() == "exit 1\n"  # head: No space left on device
    assert (out / "workspace" / "big.bin").stat().st_size < QUOTA_MB << 20
    assert json.loads((out / "sample.json").read_text())["disk_mb"] == QUOTA_MB
    # on the host: the agent's files and the verify copy, each within the quota; no disk left mounted
    assert allocated(out) < 2 * (QUOTA_MB << 20) + (16 << 20)
    assert not any(os.path.ismount(p) for p in (out / "workspace", out / "home", out / "verify"))
