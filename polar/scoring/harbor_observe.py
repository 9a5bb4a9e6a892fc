"""A Harbor reward checked against Polar's own observer (docs/tasks.md "Harbor tasks: what the verifier trusts").

test.sh runs the task's tests and writes /logs/verifier/reward.*; the agent's code that those tests import runs in
the same sandbox, as the same user, inside test.sh's process tree: it can end pytest with status 0 before any
test ran, or write the reward file itself. No rule about reward files can tell such a file from test.sh's own.
So when the task's tests are pytest files, Polar first runs them itself, as the first process of the fresh
verify sandbox, under its trusted runner (polar/scoring/observe_child.py: a channel opened before any workspace
code runs, pytest's internals watched, the read-only /tests as rootdir and conftest boundary), with the expected
test ids read here from the task's own files; test.sh runs after it. test.sh's reward is then capped at the
share of those tests the observer saw pass, and is 0 with the observer's flags when the run looks forged.

Not observed (test.sh's reward stands, and the output says why): no pytest file in /tests, or the image's
python3 cannot import pytest (probed from `/`, where no workspace file is on the path).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from polar.sandbox.runtime import Mounts, Sandbox
from polar.tasks.expected import expected_tests
from polar.tasks.task import TESTS_AT

PROBE = ["python3", "-I", "-c", "import pytest"]
PROBE_TIMEOUT_S = 60.0
_TEST_FILE = re.compile(r"(?:^|/)(test_[^/]*|[^/]*_test)\.py$")


@dataclass(frozen=True)
class Observation:
    observed: bool  # False: Polar could not run the task's tests itself (`lines` says why)
    share: float  # the expected tests that passed, of all expected (1.0 when not observed)
    flags: tuple[str, ...]  # why the run looks forged: reward 0, the sample's `suspicious`
    lines: tuple[str, ...]  # for the evaluator's output


def pytest_files(tests: Path) -> list[str]:
    """The task's pytest files that test.sh runs: those test.sh names, else every test_*.py / *_test.py."""
    found = sorted(str(p.relative_to(tests)) for p in tests.rglob("*.py")
                   if _TEST_FILE.search(str(p.relative_to(tests))) and p.is_file() and not p.is_symlink())
    script = (tests / "test.sh").read_text(errors="replace") if (tests / "test.sh").is_file() else ""
    named = [f for f in found if f in script]
    return named or found


def observe(sandbox: Sandbox, mounts: Mounts, out: Path, timeout_s: float, task_vars: Mapping[str, str] = {}
            ) -> Observation:
    from polar.scoring.evaluation import task_env
    from polar.scoring.observed import EMPTY_INI, RUNNER, runner_folder
    from polar.scoring.observer import Channel, judge

    tests = next(src for src, dst in mounts.ro_binds if dst == TESTS_AT)
    files = pytest_files(tests)
    if not files:
        return _unobserved("no pytest file in /tests")
    env = {**task_env(mounts, task_vars), "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    probe = sandbox.exec(PROBE, env, Path("/"), min(PROBE_TIMEOUT_S, timeout_s), out / "observer-probe.stdout",
                         out / "observer-probe.stderr")
    if probe.exit_code != 0 or probe.timed_out:
        return _unobserved("the image's python3 cannot import pytest")
    folder = runner_folder(mounts, "ho")  # short: the socket path inside is at most 107 bytes (AF_UNIX)
    expected = [i for f in files for i in expected_tests(tests, f)]
    channel = Channel(folder)
    argv = ["python3", "-I", str(folder / RUNNER), "pytest", str(channel.path), str(folder / EMPTY_INI), TESTS_AT,
            "--", *(f"{TESTS_AT}/{f}" for f in files)]
    try:
        ran = sandbox.exec(argv, env, mounts.cwd, timeout_s, out / "observer.stdout", out / "observer.stderr")
    finally:
        records = channel.close()
    if not records.connected:
        return _unobserved(f"Polar's runner did not start (exit {ran.exit_code})")
    verdict = judge(expected, records)
    if ran.timed_out:  # the workspace's endless loop: 0, as test.sh's own timeout would be
        return Observation(True, 0.0, (), (*verdict.lines, "[polar] the tests timed out under Polar's observer"))
    share = 0.0 if verdict.flags else (verdict.passed / len(expected) if expected else 0.0)
    return Observation(True, share, verdict.flags, verdict.lines)


def _unobserved(why: str) -> Observation:
    return Observation(False, 1.0, (), (f"[polar] not observed: {why}; test.sh's reward stands",))
