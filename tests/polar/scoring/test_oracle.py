"""The oracle defines honest work (polar/scoring/oracle.py): a task without `submit` takes its allowlist from what
its oracle created, changed or deleted, so an answer that is a new file, a binary or a commit reaches the verifier;
the right answer scores 1, a wrong one and doing nothing 0. Real bwrap sandboxes, the tasks' own verifiers."""
from __future__ import annotations

import json
import subprocess
import sys
import tarfile
import uuid
from pathlib import Path
from typing import Callable

import pytest

from polar.scoring.oracle import learned, oracle_script, run_oracle
from polar.scoring.verify import VerifyGround
from polar.tasks.load import load_tasks
from polar.tasks.task import TaskSpec
from polar.tasks.workspace import pristine
from tests.polar.scoring.verifying import verify_sample

ROOT = Path(__file__).resolve().parents[3]
HARBOR = ROOT / "fixtures" / "harbor"
ANSWER_TEST = """from pathlib import Path


def test_the_answer_file():
    assert Path("out/answer.txt").read_text().split() == ["42"]
"""


def polar(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "polar.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)


def verified(task: TaskSpec, tmp_path: Path, work: Callable[[Path], None]) -> tuple[float, VerifyGround]:
    result, ground = verify_sample(task, tmp_path, work)
    return result.reward, ground


def write(rel: str, data: str | bytes) -> Callable[[Path], None]:
    def work(workspace: Path) -> None:
        (workspace / rel).parent.mkdir(parents=True, exist_ok=True)
        (workspace / rel).write_bytes(data if isinstance(data, bytes) else data.encode())
    return work


def yaml_task(tmp_path: Path, fix: str | None) -> TaskSpec:
    """A task file's task whose answer is a new file (out/answer.txt), no `submit`, its oracle `metadata.fix`."""
    root = tmp_path / f"set-{uuid.uuid4().hex[:6]}"
    (root / "repo").mkdir(parents=True)
    (root / "repo" / "README.md").write_text("Write the answer.\n")
    (root / "tests").mkdir()
    (root / "tests" / "test_answer.py").write_text(ANSWER_TEST)
    meta = f"  metadata: {{fix: {json.dumps(fix)}}}\n" if fix else ""
    (root / "tasks.yaml").write_text("- task_id: answer\n  instruction: Write 42 into out/answer.txt.\n"
                                     "  workspace: repo\n  tests: tests\n  image: host\n"
                                     "  evaluator: {pytest: [test_answer.py], timeout_s: 60}\n" + meta)
    return load_tasks(root / "tasks.yaml")[0]


# -- a Harbor task whose answer is a new file, as terminal-bench ships most ---------------------------------------
def test_a_harbor_oracle_whose_answer_is_a_new_file_scores_one_and_teaches_the_allowlist(tmp_path) -> None:
    task = load_tasks(HARBOR / "write-hello")[0]
    assert task.submit is None and task.has_oracle  # fixtures/harbor/write-hello ships no [polar] submit
    done = polar("run", "--task", str(HARBOR / "write-hello"), "--oracle", "--runtime", "bwrap",
                 "--out", str(tmp_path / "oracle"))
    assert done.returncode == 0 and "solve.sh exit 0, reward 1" in done.stdout, done.stdout + done.stderr
    assert "allowlist learned from the oracle's changes: hello.txt" in done.stdout
    result = json.loads((tmp_path / "oracle" / "result.json").read_text())
    assert (result["status"], result["reward"], result["weight"], result["tampered"]) == ("completed", 1.0, 1.0, [])


@pytest.mark.parametrize("work, reward", [(write("hello.txt", "hello\n"), 1.0), (write("hello.txt", "bye\n"), 0.0),
                                          (lambda ws: None, 0.0)], ids=["right", "wrong", "nothing"])
def test_a_harbor_sample_is_scored_on_what_the_oracle_allows(tmp_path, work, reward) -> None:
    assert verified(load_tasks(HARBOR / "write-hello")[0], tmp_path, work)[0] == reward


# -- a task file's task, with an oracle and without -----------------------------------------------------------------
@pytest.mark.parametrize("fix", ["mkdir -p out && echo 42 > out/answer.txt", None], ids=["oracle", "no-oracle"])
def test_a_yaml_task_whose_answer_is_a_new_file(tmp_path, fix) -> None:
    task = yaml_task(tmp_path, fix)
    assert verified(task, tmp_path, write("out/answer.txt", "42\n"))[0] == 1.0
    assert verified(task, tmp_path, write("out/answer.txt", "41\n"))[0] == 0.0
    assert verified(task, tmp_path, lambda ws: None)[0] == 0.0
    reward, ground = verified(task, tmp_path, write("out/answer.txt", b"42\n\0"))  # a binary: not the oracle's kind
    assert reward == 0.0 and ground.tampered == ("out/answer.txt",)
    assert ground.notes == ("out/answer.txt dropped: a compiled or binary file; add submit: {files: "
                            "[out/answer.txt], binary: true} to the task",)


def test_the_oracle_teaches_binaries_executables_and_deletions_not_python_caches(tmp_path) -> None:
    task = yaml_task(tmp_path, None)
    ws = tmp_path / "oracle-ws"
    pristine(task.workspace, ws)
    (ws / "README.md").unlink()
    (ws / "bin").mkdir()
    (ws / "bin" / "tool").write_bytes(b"\x7fELF\0\1")
    (ws / "run.sh").write_text("#!/bin/sh\necho 42\n")
    (ws / "run.sh").chmod(0o755)
    (ws / "__pycache__").mkdir()
    (ws / "__pycache__" / "x.cpython-311.pyc").write_bytes(b"\0")
    taught = learned(task, ws)
    assert taught.globs == ("README.md", "bin/tool", "run.sh") and taught.binary and taught.source == "oracle"
    assert taught.executable == ("run.sh",)


# -- a git task: the verifier reads history ---------------------------------------------------------------------
def git_task(tmp_path: Path) -> TaskSpec:
    """A repository as the workspace (a .tar.gz, as task files take it), a verifier that reads `git log`, and an
    oracle that commits."""
    repo = tmp_path / "repo"
    repo.mkdir()
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(repo)]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / "a.txt").write_text("a\n")
    subprocess.run([*git, "add", "a.txt"], check=True)
    subprocess.run([*git, "commit", "-qm", "start"], check=True)
    with tarfile.open(tmp_path / "repo.tar.gz", "w:gz") as tar:
        tar.add(repo, arcname=".")
    commit = "git -c user.name=agent -c user.email=a@a -c safe.directory='*' commit -qam 'fix a' "
    (tmp_path / "tasks.yaml").write_text(
        "- task_id: commit-it\n  instruction: Change a.txt to b and commit it as 'fix a'.\n"
        "  workspace: repo.tar.gz\n  image: host\n"
        "  evaluator: {command: \"git -c safe.directory='*' log --format=%s | grep -qx 'fix a' && "
        "test \\\"$(git -c safe.directory='*' show HEAD:a.txt)\\\" = b\", reward: exit}\n"
        f"  metadata: {{fix: {json.dumps('echo b > a.txt && ' + commit)}}}\n")
    return load_tasks(tmp_path / "tasks.yaml")[0]


def test_a_commit_reaches_a_verifier_that_reads_history(tmp_path) -> None:
    task = git_task(tmp_path)
    result = run_oracle(task, oracle_script(task, tmp_path / "solve"), "bwrap", tmp_path / "oracle")
    assert (result.exit_code, result.evaluation.reward, result.dropped) == (0, 1.0, ()), result.evaluation.output
    globs = result.allowlist.globs
    assert {".git/objects/**", ".git/refs/**", ".git/index"} <= set(globs) and result.allowlist.binary
    assert not [g for g in globs if g.startswith((".git/hooks", ".git/config"))]  # git runs what those name

    def commit(ws: Path) -> None:  # the agent's own commit: other objects, other names than the oracle's
        (ws / "a.txt").write_text("b\n")
        subprocess.run(["git", "-c", "user.name=x", "-c", "user.email=x@x", "-C", str(ws), "commit", "-qam",
                        "fix a"], check=True)
    assert verified(task, tmp_path, commit)[0] == 1.0
    assert verified(task, tmp_path, write("a.txt", "b\n"))[0] == 0.0  # changed, not committed
    assert verified(task, tmp_path, lambda ws: None)[0] == 0.0
