"""Nothing outlives a killed run: one watchdog process per `polar run` (and per worker node) that stops what the
run started when the run's process dies, even by SIGKILL.

The run starts the watchdog first (`supervising()`), in its own session so a terminal's Ctrl-C or a kill of the
run's process group does not reach it, holding the read end of a pipe whose write end only the run (and the
processes it forks, a worker's pool) holds. Whatever could outlive the run is registered on the pipe as it starts
and released when the run stopped it itself:
  group    a process group (the sandbox's first process: every sandbox exec runs in its own group)
  cgroup   a sandbox's cgroup directories (whatever left the group: killed until empty, then removed)
  process  a service the run started (reference server, proxy, Redis): SIGTERM, SIGKILL after 3 s
  command  a stop command for what is not our child at all: `apptainer instance stop -F NAME` (the instance is
           its starter daemon's), `podman rm -f NAME` (the container is conmon's)
  path     a file or folder outside the run folder (a temporary socket folder, a private Redis's data)
When the pipe reads EOF, every writer is gone: the watchdog stops what is still registered (processes first,
then the stop commands, then the paths) and exits. A process is named with its start time (from /proc), so a
pid the kernel reused is never signalled. Why not only PR_SET_PDEATHSIG: Apptainer instances and podman
containers are no children of ours, and the death signal follows the thread that started a child, not the
process. The proxy additionally dies with its parent (polar_mitm/launch.py die_with_parent); bwrap with
--die-with-parent.

The watchdog half below runs as `python -I supervisor.py` and uses the standard library only.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any, Iterator, Mapping, Sequence

ORDER = ("group", "cgroup", "process", "command", "path")  # what goes first when the run died
COMMAND_TIMEOUT_S = 60.0


def start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (field 22 of /proc/PID/stat); None when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(fields[19]) if fields[0] != "Z" else None


# -- the run's side -----------------------------------------------------------------------------------------------
class Watch:
    """One registered thing; `release()` once the run stopped it itself."""

    def __init__(self, supervisor: Supervisor | None, key: str) -> None:
        self.supervisor, self.key = supervisor, key

    def release(self) -> None:
        if self.supervisor is not None:
            self.supervisor.send({"op": "release", "key": self.key})
            self.supervisor = None


class Supervisor:
    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc, self.lock = proc, threading.Lock()
        self.pipe: IO[bytes] = proc.stdin  # type: ignore[assignment]

    def send(self, message: dict[str, Any]) -> None:
        line = (json.dumps(message) + "\n").encode()
        with self.lock:
            try:
                self.pipe.write(line)
                self.pipe.flush()
            except (OSError, ValueError):  # the watchdog is gone: the run's own cleanup still runs
                pass

    def watch(self, kind: str, key: str | None = None, **what: Any) -> Watch:
        key = key or uuid.uuid4().hex
        self.send({"op": "watch", "key": key, "kind": kind, **what})
        return Watch(self, key)

    def close(self) -> None:
        """The run ends: the watchdog stops what is still registered (nothing, after a clean end) and exits."""
        with self.lock:
            try:
                self.pipe.close()
            except OSError:
                pass
        try:
            self.proc.wait(COMMAND_TIMEOUT_S * 2)
        except subprocess.TimeoutExpired:
            pass


_current: Supervisor | None = None  # one per process, like its signal handlers; forked children share it


@contextmanager
def supervising() -> Iterator[Supervisor]:
    """Start this process's watchdog (once: nested calls reuse it) for the duration of the block."""
    global _current
    if _current is not None:
        yield _current
        return
    _current = start_supervisor()
    try:
        yield _current
    finally:
        supervisor, _current = _current, None
        supervisor.close()


def start_supervisor() -> Supervisor:
    """This process's watchdog, started now unless it runs (a worker node's: for the node's lifetime; it acts
    when the node and every pool process forked from it are gone)."""
    global _current
    if _current is None:
        proc = subprocess.Popen([sys.executable, "-I", __file__], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, cwd="/", start_new_session=True)
        _current = Supervisor(proc)
    return _current


def _watch(kind: str, key: str | None = None, **what: Any) -> Watch:
    return _current.watch(kind, key, **what) if _current is not None else Watch(None, "")


def release(key: str) -> None:
    """Release what was registered under `key` (maybe by another process of the node: a later stage)."""
    Watch(_current, key).release()


def watch_group(pgid: int) -> Watch:
    return _watch("group", pid=pgid, start=start_time(pgid))


def watch_cgroup(dirs: Sequence[Path]) -> Watch:
    return _watch("cgroup", dirs=[str(d) for d in dirs])


def watch_process(pid: int) -> Watch:
    return _watch("process", pid=pid, start=start_time(pid))


def watch_command(key: str, argv: Sequence[str], env: Mapping[str, str] | None = None) -> Watch:
    """A stop command under a known `key`, so whoever stops the thing later releases it (release(key))."""
    return _watch("command", key, argv=list(argv), env=dict(os.environ if env is None else env))


def watch_path(path: Path, key: str | None = None) -> Watch:
    return _watch("path", key, path=str(path))


# -- the watchdog -------------------------------------------------------------------------------------------------
def _kill_group(entry: dict[str, Any]) -> None:
    try:  # while the group has members its id is not reused (the kernel keeps the pid for the group)
        os.killpg(entry["pid"], signal.SIGKILL)
    except OSError:
        pass


def _kill_cgroup(entry: dict[str, Any]) -> None:
    dirs = [Path(d) for d in entry["dirs"]]
    end = time.monotonic() + 10
    while time.monotonic() < end:
        pids = {int(p) for d in dirs if (d / "cgroup.procs").exists()
                for p in (d / "cgroup.procs").read_text().split()}
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.05)
    for d in dirs:
        for _ in range(40):
            try:
                d.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError:
                time.sleep(0.05)


def _stop_process(entry: dict[str, Any]) -> None:
    pid, start = entry["pid"], entry["start"]
    for sig, grace in ((signal.SIGTERM, 3.0), (signal.SIGKILL, 3.0)):
        if start is None or start_time(pid) != start:
            return
        try:
            os.kill(pid, sig)
        except OSError:
            return
        end = time.monotonic() + grace
        while start_time(pid) == start and time.monotonic() < end:
            time.sleep(0.05)


def _run_command(entry: dict[str, Any]) -> None:
    try:
        subprocess.run(entry["argv"], env=entry["env"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, timeout=COMMAND_TIMEOUT_S, cwd="/")
    except (OSError, subprocess.SubprocessError):
        pass


def _remove_path(entry: dict[str, Any]) -> None:
    path = Path(entry["path"])
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        try:
            path.unlink()
        except OSError:
            pass


ACTIONS = {"group": _kill_group, "cgroup": _kill_cgroup, "process": _stop_process, "command": _run_command,
           "path": _remove_path}


def watchdog(pipe: IO[bytes]) -> int:
    """Read registrations until EOF (every writer gone), then stop what is still registered."""
    entries: dict[str, dict[str, Any]] = {}
    for line in pipe:
        try:
            message = json.loads(line)
        except ValueError:
            continue
        if message.get("op") == "watch" and message.get("kind") in ACTIONS:
            entries[message["key"]] = message
        elif message.get("op") == "release":
            entries.pop(message.get("key"), None)
    for kind in ORDER:
        for entry in [e for e in entries.values() if e["kind"] == kind]:
            try:
                ACTIONS[kind](entry)
            except Exception:  # noqa: BLE001 - one failure must not spare the rest
                pass
    return 0


if __name__ == "__main__":
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_IGN)
    sys.exit(watchdog(sys.stdin.buffer))
