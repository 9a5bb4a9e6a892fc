"""The trusted observer (issue 40 item 2, docs/tasks.md "The pytest evaluator"): the reward of a pytest-based task
comes from per-test outcomes that Polar's own runner reports, over a channel opened before any workspace code
runs, checked against test ids this process took from the task's own test files. Exit status never pays.

The channel is a unix socket in a fresh folder of the verify ground's `shared` directory, which every runtime
binds at the same path (bwrap, Apptainer, docker/podman: the proxy's sockets already cross it). An inherited pipe
would not: `podman exec` / `docker exec` start the process from the engine, not from us. The parent listens,
accepts exactly one connection and closes the listener: the first process in a fresh verify sandbox is Polar's
runner (polar/scoring/observe_child.py), which connects before importing pytest, so a later connection (workspace
code's) finds nobody. The parent then sends a random nonce that the runner keeps in a closure; every record
carries it and a sequence number, so bytes the workspace writes into the channel blindly are caught.

This process never imports workspace code: the expected ids come from `ast` on the task's test files.
"""
from __future__ import annotations

import ast
import os
import secrets
import socket
import threading
from dataclasses import dataclass, field
from pathlib import Path

from polar.sandbox.bridge import unix_at_length

CHANNEL_LIMIT = 8 << 20  # bytes the parent reads from the runner at most
CONNECT_GRACE_S = 30.0  # the runner connects before it imports anything heavy


@dataclass
class Records:
    """What the runner reported, as parsed; `bad` names anything that did not come from it as it should."""

    kinds: list[tuple[str, list[str]]] = field(default_factory=list)
    bad: list[str] = field(default_factory=list)
    connected: bool = False

    def of(self, kind: str) -> list[list[str]]:
        return [fields for k, fields in self.kinds if k == kind]


class Channel:
    """The parent's end: listen at `folder/observer.sock`, accept one connection, send it the nonce, read records
    until it closes (in a thread, while the sandbox runs)."""

    def __init__(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.path = folder / "observer.sock"
        self.nonce = secrets.token_hex(16)
        self.records = Records()
        self._conn: socket.socket | None = None
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        unix_at_length(self._listener.bind, str(self.path))  # a sample folder's path may pass AF_UNIX's 108 bytes
        os.chmod(self.path, 0o666)  # the sandbox's user (polar-sandbox, or a mapped uid) connects
        self._listener.listen(1)
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        self._listener.settimeout(CONNECT_GRACE_S)
        try:
            conn, _ = self._listener.accept()
        except OSError:
            return
        finally:
            self._listener.close()  # one runner; nobody after it
            self.path.unlink(missing_ok=True)
        self._conn = conn
        with conn:
            self.records.connected = True
            conn.sendall(self.nonce.encode("ascii"))
            self._read(conn)

    def _read(self, conn: socket.socket) -> None:
        buf, total, seq = b"", 0, 0
        while total < CHANNEL_LIMIT:
            chunk = conn.recv(1 << 16)
            if not chunk:
                break
            total += len(chunk)
            buf += chunk
            *lines, buf = buf.split(b"\n")
            for line in lines:
                seq = self._parse(line, seq)
        if total >= CHANNEL_LIMIT:
            self.records.bad.append(f"the runner's channel passed {CHANNEL_LIMIT} bytes")

    def _parse(self, line: bytes, seq: int) -> int:
        parts = line.decode("ascii", "replace").split("\t")
        try:
            ok = len(parts) >= 3 and parts[0] == self.nonce and int(parts[1]) == seq + 1
            fields = [ast.literal_eval(p) for p in parts[3:]] if ok else []
        except (ValueError, SyntaxError):
            ok = False
        if not ok or not all(isinstance(f, str) for f in fields):
            self.records.bad.append(f"a record not from Polar's runner: {line[:120]!r}")
            return seq
        self.records.kinds.append((parts[2], fields))
        return seq + 1

    def close(self, wait_s: float = 10.0) -> Records:
        """The records, once the runner's end closed (its processes are gone when exec returned)."""
        self._thread.join(wait_s)
        if self._conn is not None and self._thread.is_alive():  # a process the sandbox left holds its end
            try:
                self._conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self._thread.join(1.0)
        try:
            self._listener.close()
        except OSError:
            pass
        self.path.unlink(missing_ok=True)
        return self.records


# -- the reward ---------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Verdict:
    reward: float
    lines: tuple[str, ...]  # what the parent concluded, for the evaluator's output
    flags: tuple[str, ...]  # why the run itself looks forged: reward 0 and `suspicious`
    passed: int = 0  # expected test functions with at least one report, every one of them `passed`


def judge(expected: list[str], records: Records) -> Verdict:
    """1.0 only when every expected test function has at least one `passed` report and none other, every report
    maps to an expected function, no id is reported twice, the session reached its end and nothing changed
    pytest's internals. A test the collection could not import (a failed collection record) is the workspace's
    plain 0; a test that is missing without one is flagged."""
    flags = list(records.bad)
    flags += [f"pytest internals: {f[0]}" for f in records.of("tampered") if f]
    flags += [f"introspection stopped: {f[0]}" for f in records.of("guard") if f]  # observe_guard.py's audit hook
    flags += [f"{f[0]}: {f[1]}" for f in records.of("comparison") if len(f) == 2]  # a workspace class's __eq__
    ends = records.of("end")
    if len(ends) != 1:
        flags.append("the runner ended without pytest's session end (the process exited early)" if not ends
                     else "pytest's session ended more than once")
    reports: dict[str, list[str]] = {}
    for fields in records.of("test"):
        if len(fields) == 2:
            reports.setdefault(fields[0], []).append(fields[1])
    functions = {e: [] for e in expected}
    for nodeid, outcomes in reports.items():
        if len(outcomes) > 1:
            flags.append(f"{nodeid} reported {len(outcomes)} times")
        func = _function_of(nodeid)
        if func not in functions:
            flags.append(f"{nodeid} is not one of the task's tests")
            continue
        functions[func] += outcomes
    collect_errors = [f[0] for f in records.of("collect-error") if f]
    missing = [f for f, outcomes in functions.items() if not outcomes]
    if missing and not collect_errors and ends:
        flags += [f"{f} not reported" for f in missing[:20]]
    passed = [f for f, o in functions.items() if o and all(x == "passed" for x in o)]
    lines = [f"[polar] observer: {len(passed)}/{len(expected)} expected tests passed"]
    lines += [f"[polar] collection failed: {c}" for c in collect_errors[:10]]
    lines += [f"[polar] not passed: {f} ({', '.join(o) or 'no report'})" for f, o in functions.items()
              if f not in passed][:20]
    ok = not flags and len(passed) == len(expected) and bool(expected)
    lines += [f"[polar] flagged: {f}" for f in flags[:20]]
    return Verdict(1.0 if ok else 0.0, tuple(lines), tuple(flags[:20]), len(passed))


def _function_of(nodeid: str) -> str:
    """`file::test_x[1-2]` -> `file::test_x`: parameters make several ids of one function."""
    head, sep, _tail = nodeid.partition("[")
    return head if sep and nodeid.endswith("]") else nodeid
