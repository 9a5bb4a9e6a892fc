"""Setup in layers (scripts/setup.sh): `make demo` installs only what the demo runs (Pi and Codex, no test-only
harness), `make setup`/`make test` everything; independent branches run at the same time; every step's time is
tabled; `make test` and `.ci/run` end with the time of each phase and keep the suite's exit status. The step
scripts are stubbed in a copy of the checkout's setup files: these tests install nothing."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TEST_ONLY = ("install_python_harnesses.sh", "install_openclaw.sh", "install_more_harnesses.sh", "setup_podman.sh",
             "fetch_tokenizers.sh", "install_reference_libs.sh", "fetch_models.sh")
PI, CODEX = "@mariozechner/pi-coding-agent", "@openai/codex"
STEP_SCRIPTS = ("setup_apt.sh", "setup_python.sh", "install_harnesses.sh", "install_apptainer.sh", "build_image.sh",
                "setup_sandbox_user.sh", "setup_redis.sh", "install_python_harnesses.sh", "install_openclaw.sh",
                "install_more_harnesses.sh", "setup_podman.sh", "fetch_tokenizers.sh", "install_reference_libs.sh",
                "fetch_models.sh")


def steps(*args: str) -> list[tuple[str, str, str]]:
    out = subprocess.run(["bash", str(ROOT / "scripts/setup.sh"), *args, "--dry-run"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return [tuple(line.split("\t")) for line in out.stdout.splitlines()]


def test_demo_layer_installs_no_test_only_harness():
    demo = steps("demo")
    commands = [cmd for _mode, _name, cmd in demo]
    assert not [c for c in commands if c.split()[1].rsplit("/", 1)[1] in TEST_ONLY]
    assert "bash scripts/install_harnesses.sh demo" in commands  # Pi and Codex only
    assert "bash scripts/setup_python.sh serve" in commands  # no test or trl extra
    assert "bash scripts/setup_apt.sh demo" in commands
    assert "bash scripts/build_image.sh" in commands  # the sandbox directory only: no SIF (mksquashfs)
    assert demo[0][0] == "serial" and demo[0][2].startswith("bash scripts/setup_apt.sh")  # apt first, alone


def test_full_layer_installs_everything_with_apt_alone_first():
    full = steps()
    assert steps("all") == full
    scripts = {cmd.split()[1].rsplit("/", 1)[1] for _mode, _name, cmd in full}
    assert scripts == set(STEP_SCRIPTS)
    commands = [cmd for _mode, _name, cmd in full]
    assert "bash scripts/install_harnesses.sh all" in commands
    assert "bash scripts/setup_python.sh serve,test,trl" in commands
    # the model comes through .venv's pip: the step after the venv's, in the same branch
    venv = commands.index("bash scripts/setup_python.sh serve,test,trl")
    assert commands.index("bash scripts/fetch_models.sh") == venv + 1
    assert "bash scripts/build_image.sh --sif" in commands  # image.sif too: the tests' root runs use it
    assert [mode for mode, _n, cmd in full if "setup_apt" in cmd] == ["serial"]
    assert full[-1] == ("serial", "podman and the task image as polar-tasks:local", "bash scripts/setup_podman.sh")


def npm_subset(tmp_path: Path, *names: str) -> subprocess.CompletedProcess:
    return subprocess.run(["python3", str(ROOT / "scripts/npm_subset.py"), str(ROOT / "scripts/harnesses"),
                           str(tmp_path), *names], capture_output=True, text=True, timeout=60)


def test_demo_npm_lock_is_the_full_lock_cut_to_pi_and_codex(tmp_path):
    assert npm_subset(tmp_path, PI, CODEX).returncode == 0
    full = json.loads((ROOT / "scripts/harnesses/package-lock.json").read_text())["packages"]
    pins = json.loads((ROOT / "scripts/harnesses/package.json").read_text())["dependencies"]
    manifest = json.loads((tmp_path / "package.json").read_text())
    cut = json.loads((tmp_path / "package-lock.json").read_text())["packages"]
    assert manifest["dependencies"] == {PI: pins[PI], CODEX: pins[CODEX]}
    assert cut[""]["dependencies"] == manifest["dependencies"]
    assert all(cut[key] == full[key] for key in cut if key)  # versions, hashes: the full lock's entries
    assert cut[f"node_modules/{CODEX}"]["version"] == pins[CODEX]
    assert "node_modules/@openai/codex-linux-x64" in cut  # the native binary, an optional dependency
    assert f"node_modules/{PI}" in cut and "node_modules/@mariozechner/pi-ai" in cut
    others = set(pins) - {PI, CODEX}
    assert others and not [key for key in cut if key.removeprefix("node_modules/") in others]
    assert 0 < len(cut) < len(full)


def test_every_kept_package_finds_its_dependencies_in_the_cut_lock(tmp_path):
    assert npm_subset(tmp_path, PI, CODEX).returncode == 0
    cut = json.loads((tmp_path / "package-lock.json").read_text())["packages"]

    def found(at: str, name: str) -> bool:  # node's lookup: the nearest node_modules up the path
        while True:
            if (f"{at}/node_modules/{name}" if at else f"node_modules/{name}") in cut:
                return True
            if not at:
                return False
            at = at[:at.rfind("/node_modules/")] if "/node_modules/" in at else ""

    for key, entry in cut.items():
        for dep in entry.get("dependencies", {}):
            assert found(key, dep), f"{key or 'the root'} needs {dep}"


def test_npm_subset_refuses_a_package_the_lock_does_not_pin(tmp_path):
    out = npm_subset(tmp_path, PI, "left-pad")
    assert out.returncode == 1 and "left-pad" in out.stderr
    assert not (tmp_path / "package-lock.json").exists()


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """The setup files of the checkout, copied, with every step script stubbed by `stub`."""
    (tmp_path / "scripts").mkdir()
    (tmp_path / ".ci").mkdir()
    for name in ("setup.sh", "setup_steps.sh", "lib.sh", "make_test.sh"):
        shutil.copy(ROOT / "scripts" / name, tmp_path / "scripts" / name)
    shutil.copy(ROOT / "Makefile", tmp_path / "Makefile")
    shutil.copy(ROOT / ".ci/run", tmp_path / ".ci/run")
    for name in STEP_SCRIPTS:
        stub(tmp_path, name, "step_status skipped")
    return tmp_path


def stub(root: Path, name: str, body: str) -> None:
    (root / "scripts" / name).write_text(f'set -euo pipefail\ncd "$(dirname "$0")/.."\nsource scripts/lib.sh\n{body}\n')


def test_setup_runs_branches_at_the_same_time_and_tables_every_step(checkout):
    # Each of two branches waits for the other's mark: a setup that ran them one after the other fails here.
    wait_for = 'touch .cache/{me}; for _ in $(seq 200); do [ -e .cache/{other} ] && exit 0; sleep 0.1; done; exit 1'
    stub(checkout, "setup_python.sh", wait_for.format(me="python", other="npm"))
    stub(checkout, "install_harnesses.sh", wait_for.format(me="npm", other="python"))
    stub(checkout, "setup_redis.sh", "step_status started")
    out = subprocess.run(["bash", "scripts/setup.sh", "demo"], cwd=checkout, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    table = out.stdout.split("==> setup times (demo)\n", 1)[1].splitlines()
    rows = {line[:57].strip(): line[57:].split() for line in table[1:] if line.strip() and "==>" not in line}
    assert rows["python venv and package [serve]"][1] == "installed"
    assert rows["harness CLIs pi, codex (npm, pinned)"][1] == "installed"
    assert rows["redis on 127.0.0.1:6379"][1] == "started"
    assert rows["system packages (demo)"][1] == rows["task image (mmdebstrap, cached)"][1] == "skipped"
    assert all(float(r[0]) >= 0 for r in rows.values())
    assert len(rows) == 7 + 1  # the demo layer's seven steps and the total
    assert out.stdout.rstrip().endswith("==> setup done (demo)")


def test_a_failed_step_fails_setup_after_the_others_end_with_the_table(checkout):
    stub(checkout, "install_apptainer.sh", "echo no apptainer today; exit 3")
    out = subprocess.run(["bash", "scripts/setup.sh", "all"], cwd=checkout, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode != 0
    assert "[sandbox_branch] no apptainer today" in out.stdout
    assert "sandbox_branch" in out.stderr
    table = out.stdout.split("==> setup times (all)\n", 1)[1]
    assert "FAILED (exit 3)" in table and "python harnesses (a venv each, pinned)" in table
    assert "task image" not in table  # its branch stopped at the failed step
    assert "podman" not in table and "setup done" not in out.stdout


@pytest.mark.parametrize("suite_rc", [0, 3])
def test_ci_ends_with_the_time_of_each_phase_and_the_suites_status(checkout, suite_rc):
    (checkout / "scripts/test.sh").write_text(f'echo "suite ran: $*"; exit {suite_rc}\n')
    out = subprocess.run(["bash", ".ci/run"], cwd=checkout, capture_output=True, text=True, timeout=120)
    assert out.returncode == suite_rc, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert "suite ran: " in lines
    status = "" if suite_rc == 0 else rf" \(exit {suite_rc}\)"
    assert [line for line in lines if re.fullmatch(rf"phases: setup \d+ s, tests \d+ s{status}, total \d+ s", line)]
    assert re.fullmatch(rf"ci phases: setup \d+ s, tests \d+ s{status}, total \d+ s", lines[-1])


def test_ci_says_the_tests_did_not_run_when_setup_fails(checkout):
    stub(checkout, "setup_apt.sh", "exit 4")
    (checkout / "scripts/test.sh").write_text('echo "suite ran"; exit 0\n')
    out = subprocess.run(["bash", ".ci/run"], cwd=checkout, capture_output=True, text=True, timeout=120)
    assert out.returncode == 4  # the failed step's status
    assert "suite ran" not in out.stdout and "FAILED (exit 4)" in out.stdout
    assert re.fullmatch(r"ci phases: setup \d+ s \(exit 4\), tests not run, total \d+ s", out.stdout.splitlines()[-1])
