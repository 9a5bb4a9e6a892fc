"""polar/sandbox/capture.py through run_group and a real bwrap sandbox: output past the cap keeps its head and
its tail with one line saying how much was cut; output under it is untouched."""
from __future__ import annotations

import os
from pathlib import Path

from polar.sandbox.capture import HEAD_BYTES, TAIL_BYTES
from polar.sandbox.runtime import Mounts, get_runtime, run_group

# 40 MB of numbered lines on stdout, a short line on stderr.
FLOOD = ("import sys\nw = sys.stdout.write\nfor i in range(4_000_000): w('%09d\\n' % i)\n"
         "sys.stderr.write('done\\n')")


def check_capped(out: Path, err: Path) -> None:
    data = out.read_bytes()
    assert len(data) < HEAD_BYTES + TAIL_BYTES + 200
    assert data.startswith(b"000000000\n000000001\n")
    assert data.endswith(b"003999998\n003999999\n")
    cut = 40_000_000 - HEAD_BYTES - TAIL_BYTES
    assert f"[polar: {cut} bytes of output cut here".encode() in data
    assert err.read_bytes() == b"done\n"


def test_run_group_caps_output(tmp_path):
    out, err = tmp_path / "out", tmp_path / "err"
    result = run_group(["python3", "-c", FLOOD], dict(os.environ), tmp_path, 60, out, err, None)
    assert result.exit_code == 0
    check_capped(out, err)


def test_small_output_is_kept_whole(tmp_path):
    out, err = tmp_path / "out", tmp_path / "err"
    result = run_group(["sh", "-c", "echo hello; echo oops >&2; exit 3"], dict(os.environ), tmp_path, 60, out, err)
    assert (result.exit_code, out.read_text(), err.read_text()) == (3, "hello\n", "oops\n")


def test_a_sandbox_flood_is_capped(tmp_path):
    m = Mounts(tmp_path / "home", tmp_path / "workspace", tmp_path / "sandbox")
    for d in (m.home, m.workspace, m.shared):
        d.mkdir()
    box = get_runtime("bwrap").prepare(m)
    out, err = tmp_path / "out", tmp_path / "err"
    env = {"PATH": "/usr/bin:/bin", "HOME": str(m.home)}
    result = box.exec(["python3", "-c", FLOOD], env, m.workspace, 120, out, err)
    assert result.exit_code == 0
    check_capped(out, err)
