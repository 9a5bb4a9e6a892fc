"""The suite runs in parallel (scripts/test.sh: pytest-xdist workers in one network namespace), so every test
file must be collected by that run and no test may bind a fixed port another worker could hold."""
from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"
# The one fixed port: the provider listener (443, what a leak would reach) on a loopback address of each
# worker's own (tests/polar_mitm/conftest.py worker_loopback), so two workers never share it.
FIXED_PORT_ALLOWED = {("tests/polar_mitm/conftest.py", "CountingListener", 443)}


def test_files() -> list[str]:
    return sorted(str(p.relative_to(ROOT)) for p in TESTS.rglob("test_*.py"))


def fixed_ports(path: Path) -> list[tuple[str, int, int]]:
    """(what, port, line) for every literal non-zero port in a test module: `.bind((host, N))`, `port=N`,
    a call's `N` after a "--port" string, `CountingListener(N)`."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, ast.Call):
            continue
        name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        literals = [(name, a.value) for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, int)
                    and name == "CountingListener"]
        if name == "bind" and node.args and isinstance(node.args[0], ast.Tuple):
            port = node.args[0].elts[-1]
            if isinstance(port, ast.Constant) and isinstance(port.value, int):
                literals.append(("bind", port.value))
        literals += [(f"{name}(port=)", k.value.value) for k in node.keywords
                     if k.arg == "port" and isinstance(k.value, ast.Constant) and isinstance(k.value.value, int)]
        strings = [a.value if isinstance(a, ast.Constant) else None for a in node.args]
        for arg in (node.args[0].elts if node.args and isinstance(node.args[0], ast.List) else []):
            strings.append(arg.value if isinstance(arg, ast.Constant) else None)
        for before, after in zip(strings, strings[1:]):
            if before == "--port" and isinstance(after, str) and after.isdigit():
                literals.append(("--port", int(after)))
        found += [(what, port, node.lineno) for what, port in literals if port not in (0, 1)]  # 1: refused by name
    return found


def test_no_test_binds_a_fixed_port() -> None:
    offenders = []
    for path in sorted(TESTS.rglob("*.py")):
        rel = str(path.relative_to(ROOT))
        for what, port, line in fixed_ports(path):
            if (rel, what, port) not in FIXED_PORT_ALLOWED:
                offenders.append(f"{rel}:{line}: {what} {port}")
    assert not offenders, "fixed ports in tests (bind port 0 or use launch.free_port):\n" + "\n".join(offenders)


def test_the_fixed_port_check_finds_one(tmp_path: Path) -> None:
    sample = tmp_path / "test_sample.py"
    sample.write_text("import socket, subprocess\ns = socket.socket()\ns.bind(('127.0.0.1', 8080))\n"
                      "subprocess.run(['redis-server', '--port', '6379'])\nserve(port=30000)\n")
    assert sorted(p for _, p, _ in fixed_ports(sample)) == [6379, 8080, 30000]


def collected_files(*args: str) -> set[str]:
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *args],
                         capture_output=True, text=True, cwd=ROOT, timeout=300,
                         env={**os.environ, "PYTEST_ADDOPTS": ""})
    assert out.returncode in (0, 5), out.stdout[-3000:] + out.stderr[-3000:]
    return {m.group(1) for m in re.finditer(r"^(tests/\S+?\.py)::", out.stdout, re.M)}


def test_every_test_file_runs_under_the_parallel_runner(request: pytest.FixtureRequest) -> None:
    """scripts/test.sh's two runs (`-m "not serial"` on the workers, `-m serial` alongside them, one test at a
    time) together collect every test file on disk: none is ignored or fails to import."""
    script = (ROOT / "scripts" / "test.sh").read_text()
    parallel_run = r'pytest_at 10 -n "\$workers" --dist loadfile -m "not serial"'
    assert re.search(parallel_run, script), "parallel run changed"
    on_disk = set(test_files())
    # In the whole suite's run this session is the parallel run itself (each xdist worker collects every test):
    # when it holds every file not marked serial, nothing is left to find; otherwise collect that run afresh.
    # The serial run is collected only over the files the first one lacks.
    running = {item.nodeid.split("::")[0] for item in request.session.items}
    marked = {f for f in on_disk if re.search(r"mark\.serial\b", (ROOT / f).read_text())}
    parallel = running if on_disk - marked <= running else collected_files("-m", "not serial")
    missing = sorted(on_disk - parallel)
    serial = collected_files("-m", "serial", *missing) if missing else set()
    assert on_disk - (parallel | serial) == set(), "test files no run collects (import error? ignored?)"
