"""Safe by default (issue 17): a harness in an isolated runtime cannot write or read the host's files outside its
binds, cannot reach a host TCP port, is bounded in memory and processes, and leaves no process behind; `local`
can do all of that and says so.

The attempts are the script of fixtures/policies/escape-attempts.yaml: run here directly in each runtime (cheap),
and once end to end by a real harness (pi) whose scripted policy calls its shell tool with it.
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import threading
import uuid
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import yaml

from polar.sandbox import limits as limits_mod
from polar.sandbox import runtime as runtime_mod
from polar.harness.adapters import load_adapter
from polar.sandbox.limits import Limits
from polar.run.session import EngineConfig, RunConfig, run_session
from polar.sandbox.runtime import (LOCAL_WARNING, REGISTRY, BwrapRuntime, Mounts, get_runtime, resolve_runtime)

ROOT = Path(__file__).resolve().parents[3]
POLICY = ROOT / "fixtures" / "policies" / "escape-attempts.yaml"
ISOLATED = ["bwrap", "apptainer", "docker"]  # every runtime that claims isolation
IMAGE = ROOT / ".cache" / "images" / "polar-tasks" / "rootfs"  # the demo tasks' image (make setup builds it)
SMALL = Limits(memory_bytes=512 << 20, processes=128)
# Writes to read-only places; HOME's parent is read-only in bwrap, a private tmpfs in apptainer: never the host's.
WRITES = ("write-checkout", "write-host-home")
READS = ("read-host-home", "read-other-run", "read-checkout")


def escape_script() -> str:
    rules = {r["name"]: r for r in yaml.safe_load(POLICY.read_text())["rules"]}
    return rules["escape"]["tool_calls"][0]["arguments"]["command"]


def process_bound() -> bool:
    """Whether this machine bounds a sandbox's processes (a cgroup, or RLIMIT_NPROC for a non-root uid)."""
    return limits_mod.mechanism().startswith("cgroup") or os.geteuid() != 0


@dataclass
class Host:
    """What the attempts aim at: planted secrets, a TCP listener, the places a write must not reach."""

    run: Path  # this run's folder
    secret_home: Path
    secret_run: Path
    port: int
    accepted: list
    name: str

    def written(self) -> list[Path]:
        places = (self.run, Path("/tmp"), ROOT, Path.home())
        return [p / self.name for p in places if (p / self.name).exists()]


@pytest.fixture
def host(tmp_path):
    name = f"polar-escape-{uuid.uuid4().hex[:8]}"
    secret_home = Path.home() / f".{name}-secret"
    secret_home.write_text("secret of the host user\n")
    other = tmp_path / "other-run"
    other.mkdir()
    (other / "secret.txt").write_text("secret of another run\n")
    listener = socket.create_server(("127.0.0.1", 0))
    accepted: list = []
    threading.Thread(target=lambda: accepted.append(listener.accept()), daemon=True).start()
    h = Host(tmp_path / "run", secret_home, other / "secret.txt", listener.getsockname()[1], accepted, name)
    yield h
    listener.close()
    secret_home.unlink()
    for p in h.written():
        p.unlink()


def targets(host: Host, bomb: bool) -> str:
    return (f"HOST_HOME={Path.home()}\nSECRET_HOME={host.secret_home}\nSECRET_RUN={host.secret_run}\n"
            f"CHECKOUT={ROOT}\nHOST_PORT={host.port}\nNAME={host.name}\nBOMB={int(bomb)}\n")


def mounts_in(run: Path) -> Mounts:
    m = Mounts(run / "home", run / "workspace", run / "sandbox")
    for d in (m.home, m.workspace, m.shared):
        d.mkdir(parents=True, exist_ok=True)
    return m


def prepare(runtime: str, m: Mounts, limits: Limits):
    if runtime not in ("apptainer", "docker"):
        return get_runtime(runtime, limits=limits).prepare(m)
    if not (IMAGE / "usr" / "bin" / "python3").exists():
        pytest.fail(f"image {IMAGE} missing (make setup builds it: scripts/build_image.sh)")
    if runtime == "docker":
        from tests.polar.sandbox.test_docker import require_engine

        require_engine()
        return get_runtime("docker", limits=limits).prepare(m, image=str(IMAGE))
    return get_runtime("apptainer").prepare(m, image=str(IMAGE))  # the default limits (exec's cgroup)


def sandbox_run(runtime: str, m: Mounts, script: str, limits: Limits = SMALL, timeout: float = 120):
    sandbox = prepare(runtime, m, limits)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(m.home), "LANG": "C.UTF-8"}
    out, err = m.shared / "out", m.shared / "err"
    result = sandbox.exec(["bash", "-c", script], env, m.workspace, timeout, out, err)
    sandbox.stop()
    return result, out.read_text(), err.read_text()


def attempts(out: str) -> dict[str, tuple[str, str]]:
    """'NAME: done|refused: MESSAGE' lines -> {NAME: (outcome, message)}."""
    found = {}
    for line in out.splitlines():
        parts = line.split(": ", 2)
        if len(parts) == 3 and parts[1] in ("done", "refused"):
            found[parts[0]] = (parts[1], parts[2])
    return found


def host_processes(*args: str) -> list[str]:
    """Command lines of host processes that are exactly one of `args` (e.g. 'sleep 1000')."""
    found = []
    for p in Path("/proc").glob("[0-9]*"):
        try:
            cmd = (p / "cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
        except OSError:
            continue
        if cmd in args:
            found.append(cmd)
    return found


def assert_contained(host: Host, out: str) -> None:
    tried = attempts(out)
    for name in READS + ("reach-host-port",):
        assert tried[name][0] == "refused", f"{name}: {tried[name]}\n{out}"
    # A write may succeed inside the sandbox when its target is under the sandbox's private /tmp (a checkout
    # under /tmp, the host's /tmp): what counts is that nothing appears on the host (host.written below).
    assert all(name in tried for name in WRITES)
    assert "secret of" not in out and "# Polar" not in out
    assert host.written() == []
    assert host.accepted == []  # nothing reached the host's listener
    assert tried["leave-processes"][0] == "done"  # it may start them; they must not outlive the sample


@pytest.mark.parametrize("runtime", ISOLATED)
def test_escape_attempts_fail(runtime, host):
    (m := mounts_in(host.run)).workspace.joinpath("targets.env").write_text(targets(host, bomb=False))
    result, out, err = sandbox_run(runtime, m, escape_script())
    assert result.exit_code == 0 and "attempts-over" in out, out + err
    assert_contained(host, out)
    assert host_processes("sleep 1000", "sleep 999") == []


@pytest.mark.parametrize("runtime", ISOLATED)
def test_fork_bomb_is_bounded_and_the_node_keeps_serving(runtime, host):
    if not process_bound():
        pytest.skip(f"this machine bounds no sandbox's processes ({limits_mod.mechanism()}): root without cgroups")
    (m := mounts_in(host.run)).workspace.joinpath("targets.env").write_text(targets(host, bomb=True))
    result, out, err = sandbox_run(runtime, m, escape_script())
    bomb = attempts(out)["fork-bomb"]
    assert bomb[0] == "refused" and "fork" in bomb[1].lower(), out + err  # "Cannot fork": an ordinary error
    assert result.exit_code == 0 and "attempts-over" in out
    assert_contained(host, out)
    again, out, _ = sandbox_run(runtime, m, "echo still-serving")
    assert again.exit_code == 0 and out == "still-serving\n"


@pytest.mark.parametrize("runtime", ["local", "bwrap", "docker"])  # apptainer: the default limits (4 GiB)
def test_memory_is_bounded(runtime, tmp_path):
    m = mounts_in(tmp_path)
    hog = "python3 -c \"b = b'x' * (1 << 30); print('allocated', len(b))\"; echo exit=$?"
    result, out, _ = sandbox_run(runtime, m, hog, Limits(memory_bytes=256 << 20, processes=64))
    assert result.exit_code == 0 and "allocated" not in out and "exit=0" not in out, out


def test_memory_rlimit_fallback(tmp_path, monkeypatch):
    """Without a cgroup (a machine where Polar may not create one), RLIMIT_DATA still stops the hog."""
    monkeypatch.setattr(runtime_mod, "make_cgroup", lambda limits: None)
    m = mounts_in(tmp_path)
    hog = "python3 -c \"b = b'x' * (1 << 30)\" 2>&1 | tail -n 1"
    result, out, _ = sandbox_run("bwrap", m, hog, Limits(memory_bytes=256 << 20, processes=64))
    assert result.exit_code == 0 and out.strip() == "MemoryError", out


@pytest.mark.parametrize("runtime", ["local", *ISOLATED])
def test_left_behind_processes_are_reaped(runtime, tmp_path):
    m = mounts_in(tmp_path)
    tag = 1000 + int(uuid.uuid4().hex[:4], 16) % 5000  # a sleep only this test starts
    script = f"sleep {tag} & setsid sleep {tag + 1} & (setsid sh -c 'sleep {tag + 2}' &); sleep 0.5; echo left"
    result, out, _ = sandbox_run(runtime, m, script)
    assert result.exit_code == 0 and out == "left\n"
    assert host_processes(*(f"sleep {tag + i}" for i in range(3))) == []


def test_bwrap_view_is_minimal(tmp_path):
    m = mounts_in(tmp_path / "run")
    (tmp_path / "other-run").mkdir()  # a sibling run folder on the host
    script = ("ls /; echo --; ls -A /etc; echo --; ls -A " + str(ROOT) + "; echo --; "
              "for d in /root /home /var /srv /opt /work/shared /sys; do [ -e $d ] && echo $d; done; echo --; "
              f"ls -A {tmp_path}; ls -A {tmp_path / 'run'}; echo --; touch {tmp_path / 'run' / 'x'} || echo ro")
    result, out, err = sandbox_run("bwrap", m, script)
    root, etc, checkout, present, tmp, run = [part.split() for part in out.split("--\n")]
    assert result.exit_code == 0, err
    assert set(root) <= {"bin", "dev", "etc", "lib", "lib32", "lib64", "libx32", "proc", "sbin", "tmp", "usr",
                         ROOT.parts[1]}
    assert set(etc) <= {n.split("/")[0] for n in runtime_mod.ETC_FILES} and "shadow" not in etc
    assert checkout == [".tools"]  # the harness CLIs, nothing else of the checkout
    assert present == []
    assert tmp == ["run", "home", "sandbox", "workspace"]  # this run's binds only, not its siblings
    assert run[-1] == "ro" and not (tmp_path / "run" / "x").exists()  # HOME's parent is read-only


def test_auto_is_the_most_isolated_installed():
    assert resolve_runtime("auto") == "bwrap"
    assert isinstance(get_runtime("auto"), BwrapRuntime)
    with_image = resolve_runtime("auto", image="task.sif")
    apptainer = "apptainer" in REGISTRY and runtime_mod._apptainer_installed()
    assert with_image == ("apptainer" if apptainer else "bwrap")
    assert resolve_runtime("auto", image="host") == "bwrap"
    assert resolve_runtime("local") == "local"  # only when asked
    with pytest.raises(ValueError, match="unknown runtime"):
        get_runtime("kvm")


def test_local_warns_that_the_host_is_writable(host, capsys):
    (m := mounts_in(host.run)).workspace.joinpath("targets.env").write_text(targets(host, bomb=False))
    result, out, _ = sandbox_run("local", m, escape_script())
    warning = capsys.readouterr().err.splitlines()
    assert warning == [LOCAL_WARNING] and "host" in warning[0]
    tried = attempts(out)
    assert result.exit_code == 0 and all(tried[n][0] == "done" for n in WRITES + READS), out
    assert tried["write-home-parent"][0] == tried["write-host-tmp"][0] == "done"
    assert len(host.written()) == 4  # the run's folder, host /tmp, the checkout, the host user's home


def shell_output(records: list[dict]) -> str:
    """The text of the tool result that came back to the harness with the attempts' lines (chat API)."""
    for record in records:
        for message in record["request"].get("messages", []):
            content = message.get("content") if message.get("role") == "tool" else None
            text = content if isinstance(content, str) else "".join(p.get("text", "") for p in content or [])
            if "attempts-over" in text:
                return text
    raise AssertionError(f"no tool result with the attempts in {len(records)} records")


@pytest.mark.slow
def test_harness_cannot_escape_the_default_runtime(host, start_reference_server, long_model, tmp_path):
    """pi, in the default runtime, runs the escape attempts with its shell tool: all fail as ordinary errors
    (the tool result says so), the sample completes, and the engine and the host keep serving."""
    workdir = tmp_path / "task"
    workdir.mkdir()
    (workdir / "targets.env").write_text(targets(host, bomb=process_bound()))
    backend = start_reference_server(POLICY, long_model)
    cfg = RunConfig(load_adapter("pi"), "Try to leave the sandbox.", host.run, timeout_s=300, workdir=workdir,
                    confdir=tmp_path / "mitm")
    result = run_session(cfg, EngineConfig(long_model, backend=backend))
    harness = json.loads((host.run / "harness.json").read_text())
    stdout = (host.run / "harness.stdout").read_text()
    diag = f"{stdout}\n{(host.run / 'harness.stderr').read_text()[-2000:]}"
    assert harness["runtime"] == "auto" and result.status == "completed" and result.exit_code == 0, diag
    assert stdout.strip().endswith("Done."), diag
    records = [json.loads(line) for f in result.files for line in Path(f).read_text().splitlines()]
    out = shell_output(records)
    assert "attempts-over" in out, out
    assert_contained(host, out)
    if process_bound():
        assert attempts(out)["fork-bomb"][0] == "refused", out
    assert host_processes("sleep 1000", "sleep 999") == []
    assert httpx.get(f"{backend}/health", timeout=30).json()["status"] == "ok"


# Issue 23: what a host-root agent could do before (a sysctl written, /sys writable, a setuid-root file left in the
# output folder), tried from inside each isolated runtime; each line says done or refused. A write puts back
# the value it read: where a runtime fails, the host is left as it was.
PRIVILEGE_PROBES = r"""
probe() { name=$1; shift; if out=$("$@" 2>&1); then echo "$name: done: $out"; else echo "$name: refused: $out"; fi; }
probe sysctl-write sh -c 'v=$(cat /proc/sys/kernel/printk_ratelimit_burst) && echo "$v" > /proc/sys/kernel/printk_ratelimit_burst'
probe core-pattern sh -c 'v=$(cat /proc/sys/kernel/core_pattern) && echo "$v" > /proc/sys/kernel/core_pattern'
probe sysrq sh -c 'echo h > /proc/sysrq-trigger'
probe sys-write sh -c 'for f in /sys/power/state /sys/kernel/mm/transparent_hugepage/enabled; do [ -e $f ] && : > $f && exit 0; done; ls /sys >/dev/null 2>&1 && touch /sys/x'
probe fallocate-500G fallocate -l 500G big
cp /bin/sh suid-sh && chmod 4755 suid-sh && chmod 2755 . && echo "setuid-made: done: $(stat -c %a suid-sh)"
echo "uid-inside: done: $(id -u)"
echo probes-over
"""


def host_uid_of(cmdline: str, deadline_s: float = 60) -> int:
    """The real uid, as the host sees it (/proc/PID/status), of the host process running exactly `cmdline`."""
    import time

    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        for p in Path("/proc").glob("[0-9]*"):
            try:
                if (p / "cmdline").read_bytes().replace(b"\0", b" ").decode().strip() == cmdline:
                    uid_line = next(x for x in (p / "status").read_text().splitlines() if x.startswith("Uid:"))
                    return int(uid_line.split()[1])
            except (OSError, StopIteration):
                continue
        time.sleep(0.05)
    raise AssertionError(f"no host process {cmdline!r}")


@pytest.mark.parametrize("runtime", ISOLATED)
def test_sandbox_holds_no_host_privilege(runtime, tmp_path):
    """From inside, started by root: no sysctl, /proc/sysrq-trigger or /sys write; the sandbox's process is not
    uid 0 on the host (under podman it is root inside, polar-sandbox's first subordinate id outside); a mode-4755
    file it leaves is no setuid file on the host; a 500 GB fallocate fails
    inside (RLIMIT_FSIZE) and takes nothing from the host's disk."""
    m = mounts_in(tmp_path)
    free_before = shutil.disk_usage(m.workspace).free
    tag = 2000 + int(uuid.uuid4().hex[:4], 16) % 5000
    seen: list[int] = []
    watcher = threading.Thread(target=lambda: seen.append(host_uid_of(f"sleep 4.{tag}")), daemon=True)
    watcher.start()
    result, out, err = sandbox_run(runtime, m, PRIVILEGE_PROBES + f"sleep 4.{tag}; echo slept\n")
    watcher.join(5)
    tried = attempts(out)
    assert result.exit_code == 0 and "probes-over" in out and "slept" in out, out + err
    for name in ("sysctl-write", "core-pattern", "sysrq", "sys-write", "fallocate-500G"):
        assert tried[name][0] == "refused", f"{name}: {tried[name]}\n{out}"
    assert seen and seen[0] != 0, f"host uid of the sandbox's process: {seen}"
    big = m.workspace / "big"
    assert not big.exists() or big.stat().st_blocks * 512 <= runtime_mod.DEFAULT_LIMITS.file_bytes
    assert free_before - shutil.disk_usage(m.workspace).free < 1 << 30  # others' tests write too: a margin
    made = m.workspace / "suid-sh"
    assert tried["setuid-made"] == ("done", "4755")  # inside, the chmod works...
    st = made.stat()
    assert st.st_uid == seen[0] != 0  # ...on a file the host sees owned by the sandbox's uid, not root
    assert st.st_mode & 0o6000 == 0 and m.workspace.stat().st_mode & 0o6000 == 0  # and the bits are gone after exec
    if os.geteuid() == 0:
        from polar.sandbox.docker import find_engine
        from polar.sandbox.identity import sandbox_identity, subordinate_range

        if runtime == "docker" and find_engine().kind == "podman":  # root inside, polar-sandbox's ids outside
            assert tried["uid-inside"] == ("done", "0") and seen[0] == subordinate_range().uid
        else:
            assert seen[0] == sandbox_identity().uid  # the polar-sandbox user, not nobody
