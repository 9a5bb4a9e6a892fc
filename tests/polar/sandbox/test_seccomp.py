"""The seccomp filter and the nested-user-namespace refusal (polar/sandbox/seccomp.py, issue 41 item 5): in every
isolated runtime `unshare -Ur true` fails, and so do clone with CLONE_NEWUSER, mount and keyctl called
directly; clone3 answers ENOSYS (glibc falls back to clone), and threads and child processes still work."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from polar.sandbox import seccomp
from polar.sandbox.runtime import Mounts, get_runtime
from tests.polar.sandbox.test_apptainer import demo_image

PROBE = r"""
import ctypes, json, os, subprocess, threading
libc = ctypes.CDLL(None, use_errno=True)
def call(nr, *args):
    rc = libc.syscall(nr, *args)
    return 0 if rc >= 0 else ctypes.get_errno()
seen = []
t = threading.Thread(target=seen.append, args=(1,)); t.start(); t.join()
out = {"unshare_user": call(272, 0x10000000), "clone_user": call(56, 0x10000000 | 17, 0, 0, 0, 0),
       "clone3": call(435, 0, 0), "mount": call(165, 0, 0, 0, 0, 0), "keyctl": call(250, 0, 0, 0, 0, 0),
       "thread": seen == [1], "child": subprocess.run(["true"]).returncode,
       "unshare_cmd": subprocess.run(["unshare", "-Ur", "true"], capture_output=True).returncode}
print(json.dumps(out))
"""


def test_the_bpf_program_is_whole_instructions() -> None:
    program = seccomp.bpf_program()
    assert program and len(program) % 8 == 0  # struct sock_filter is 8 bytes


def test_the_engine_profile_takes_the_denied_calls_out_of_its_allowlist() -> None:
    base = {"defaultAction": "SCMP_ACT_ERRNO", "syscalls": [{"names": ["read", "unshare", "mount"],
                                                             "action": "SCMP_ACT_ALLOW"}]}
    profile = seccomp.oci_profile(base)
    allowed = [r for r in profile["syscalls"] if r["action"] == "SCMP_ACT_ALLOW" and not r.get("args")]
    assert allowed == [{"names": ["read"], "action": "SCMP_ACT_ALLOW"}]
    conditional = [r for r in profile["syscalls"] if r.get("args")]
    assert {r["action"] for r in conditional} == {"SCMP_ACT_ALLOW", "SCMP_ACT_ERRNO"}


def _sandbox(runtime: str, base: Path):
    if runtime == "docker":
        from tests.polar.sandbox.test_docker import require_engine

        require_engine()
    mounts = Mounts(base / "home", base / "workspace", base / "shared")
    for d in (mounts.home, mounts.workspace, mounts.shared):
        d.mkdir()
    image = None if runtime == "bwrap" else str(demo_image())
    return mounts, get_runtime(runtime).prepare(mounts, image=image)


@pytest.mark.parametrize("runtime", ["bwrap", "apptainer", "docker"])
def test_no_nested_user_namespace_and_agents_still_run(tmp_path, runtime: str) -> None:
    if runtime == "bwrap" and not shutil.which("bwrap"):
        pytest.skip("bwrap not installed")
    mounts, box = _sandbox(runtime, tmp_path)
    try:
        result = box.exec(["python3", "-c", PROBE], {"PATH": "/usr/bin:/bin", "HOME": str(mounts.home)},
                          mounts.workspace, 60, tmp_path / "out", tmp_path / "err")
    finally:
        box.stop()
    text = (tmp_path / "out").read_text()
    assert result.exit_code == 0, text + (tmp_path / "err").read_text()
    seen = json.loads(text.strip().splitlines()[-1])
    assert seen["unshare_cmd"] != 0  # `unshare -Ur true` fails
    assert seen["unshare_user"] == seen["clone_user"] == seen["mount"] == seen["keyctl"] == 1  # EPERM
    assert seen["clone3"] == 38  # ENOSYS: the C library falls back to clone
    assert seen["thread"] and seen["child"] == 0
