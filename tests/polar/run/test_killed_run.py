"""Nothing outlives a killed run (issue 41 item 4): `polar run --task` with a policy that keeps the harness busy
is SIGKILLed while its harness runs; within seconds no process of the run is left (the reference server, the
proxy, the private Redis, the harness and everything it started), no Apptainer instance or podman container of
it, and no file outside the run folder holds its session token."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.polar.sandbox.test_apptainer import apptainer_bin, demo_image

ROOT = Path(__file__).resolve().parents[3]
DEMO = ROOT / "fixtures" / "tasks" / "tasks.yaml"
GONE_WITHIN_S = 10.0


def descendants(pid: int) -> set[int]:
    """Every live process below `pid` (by parent links in /proc)."""
    children: dict[int, list[int]] = {}
    for d in Path("/proc").glob("[0-9]*"):
        try:
            ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(d.name))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def of_run(out: Path) -> set[int]:
    """Processes whose command line or working directory names the run folder (the harness runs in its
    workspace; the services' logs and captures are in it)."""
    found = set()
    for d in Path("/proc").glob("[0-9]*"):
        try:
            cmdline = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            cwd = os.readlink(d / "cwd")
        except OSError:
            continue
        if str(out) in cmdline or cwd.startswith(str(out)):
            found.add(int(d.name))
    return found


def alive(pids: set[int]) -> set[int]:
    left = set()
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            left.add(pid)
    return left


def describe(pids: set[int]) -> str:
    lines = []
    for pid in sorted(pids):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
            lines.append(f"{pid}: {cmdline[:200]!r}")
        except OSError:
            pass
    return "\n".join(lines)


def files_holding(token: str, since: float) -> list[Path]:
    """Files of Polar's in the temporary directory (polar-* and what they hold) changed since `since` that hold
    `token` (a private Redis's data, an engine's environment file)."""
    found = []
    for top in Path(tempfile.gettempdir()).glob("polar-*"):
        for path in [top, *(top.rglob("*") if top.is_dir() and not top.is_symlink() else [])]:
            try:
                if path.is_file() and not path.is_symlink() and path.stat().st_mtime >= since - 1 \
                        and token.encode() in path.read_bytes():
                    found.append(path)
            except OSError:
                continue
    return found


def sandboxes(runtime: str) -> str:
    """The runtime's own list of what it runs (instances, containers), as text."""
    if runtime == "apptainer":
        return subprocess.run([str(apptainer_bin()), "instance", "list"], capture_output=True, text=True).stdout
    if runtime == "docker":
        from polar.sandbox.docker import find_engine

        return find_engine().run(["ps", "-a", "--format", "{{.Names}}"], check=False).stdout
    return ""


@pytest.mark.slow
@pytest.mark.parametrize("runtime", ["bwrap", "apptainer", "docker"])
def test_sigkill_of_polar_run_leaves_nothing(tmp_path, policies_dir, tiny_model_dir, runtime: str) -> None:
    if runtime == "docker":
        from tests.polar.sandbox.test_docker import require_engine

        require_engine()
    demo_image()
    out, since = tmp_path / "killed", time.time()
    cmd = [sys.executable, "-m", "polar.cli", "run", "--task", str(DEMO), "--task-id", "fix-calc", "--adapter", "pi",
           "--runtime", runtime, "--policy", str(policies_dir / "loop-shell.yaml"), "--model", str(tiny_model_dir),
           "--out", str(out), "--confdir", str(tmp_path / "mitm")]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    name = None
    try:
        deadline = time.monotonic() + 240
        while not list(out.glob("services/captures/*/*.jsonl")):  # the harness is running: it made a call
            assert proc.poll() is None and time.monotonic() < deadline, f"polar run ended early: {proc.returncode}"
            time.sleep(0.2)
        state = json.loads((out / "sample.json").read_text())
        token, name = state["session"]["token"], state.get("instance")
        run = descendants(proc.pid) | of_run(out)
        assert len(run) >= 4, describe(run)  # engine, proxy, redis and the harness's processes at least
        if name:
            assert name in sandboxes(runtime)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        deadline = time.monotonic() + GONE_WITHIN_S
        while (left := alive(run | of_run(out))) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not left, f"left after SIGKILL:\n{describe(left)}"
        if name:
            while name in sandboxes(runtime) and time.monotonic() < deadline:
                time.sleep(0.2)
            assert name not in sandboxes(runtime)
        assert files_holding(token, since) == []
    finally:
        proc.kill()
        proc.wait()
        clean_up(runtime, out, name)


def clean_up(runtime: str, out: Path, name: str | None) -> None:
    """What a failing run left, so a failure costs the machine nothing."""
    for pid in alive(of_run(out)):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    if name and runtime == "apptainer":
        subprocess.run([str(apptainer_bin()), "instance", "stop", "-F", name], capture_output=True)
    elif name and runtime == "docker":
        from polar.sandbox.docker import find_engine

        find_engine().run(["rm", "-f", "-t", "0", name], check=False)
