"""Harbor task directories (issue 31, polar/tasks/harbor.py): fixtures/harbor read as they are; the verifier's
tests at /tests and its reward at /logs/verifier in the verify sandbox only; `--oracle` runs solution/solve.sh;
the fixture tasks through `polar run --task` with two real harnesses (pi and codex, scripted by
fixtures/policies/harbor.yaml) in bubblewrap; a policy that looks for the tests finds none; malformed task.toml
files are one line naming the file and the field."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import uuid
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from polar.run.sample import SampleResult
from polar.sandbox.docker import build_dockerfile, dockerfile_bases
from polar.sandbox.limits import DEFAULT_LIMITS
from polar.sandbox.runtime import SandboxError, names_oci_image, resolve_runtime
from polar.tasks.harbor import read_reward
from polar.tasks.load import load_tasks
from polar.tasks.task import TaskError
from polar_traj import read as read_trajectories
from tests.polar.sandbox.test_docker import require_engine
from tests.polar.sandbox.test_egress import stand_in_host

ROOT = Path(__file__).resolve().parents[3]
HARBOR = ROOT / "fixtures" / "harbor"
POLICY = ROOT / "fixtures" / "policies" / "harbor.yaml"


def polar(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "polar.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


def task_copy(tmp: Path, name: str, files: dict[str, str] | None = None) -> Path:
    """A fixture task copied under tmp, with some of its files replaced (path in the task -> text)."""
    dest = tmp / name
    shutil.copytree(HARBOR / name, dest)
    for rel, text in (files or {}).items():
        (dest / rel).write_text(text)
    return dest


# -- reading ------------------------------------------------------------------------------------------------------
def test_the_fixture_folder_reads_as_three_tasks():
    tasks = {t.task_id: t for t in load_tasks(HARBOR)}
    assert sorted(tasks) == ["count-lines", "fix-mul", "write-hello"]
    fix = tasks["fix-mul"]
    assert fix.instruction.startswith("Fix the bug in mul.py")
    assert (fix.timeout_s, fix.evaluator.kind, fix.evaluator.timeout_s, fix.image) == (240.0, "harbor", 60.0, "host")
    assert fix.workspace == HARBOR / "fix-mul" / "environment" / "workspace"
    assert fix.tests == HARBOR / "fix-mul" / "tests"
    assert fix.metadata["difficulty"] == "easy" and fix.metadata["harbor"] == {"cpus": 1.0, "memory_mb": 2048}
    assert (fix.memory_mb, fix.cpus) == (2048, 1.0)  # 1.0's memory = "2G"
    assert (fix.sandbox_limits().memory_bytes, fix.sandbox_limits().cpus) == (2 << 30, 1.0)
    assert tasks["count-lines"].sandbox_limits() == DEFAULT_LIMITS  # no resources named: the node's
    assert tasks["write-hello"].metadata["harbor"]["memory_mb"] == 1024  # schema 1.1's memory_mb
    assert tasks["write-hello"].metadata["harbor"]["task"]["name"] == "polar/write-hello"
    assert tasks["count-lines"].workspace is None  # an empty workspace
    assert [t.task_id for t in load_tasks(HARBOR / "fix-mul")] == ["fix-mul"]  # one task directory


@pytest.mark.parametrize("header", ['version = "1.0"', 'schema_version = "1.2"', 'schema_version = "1.4"',
                                    'version = "2.0"', 'schema_version = "2.1"', ""])
def test_schema_versions_in_use_are_read(tmp_path, header, capsys):
    task = task_copy(tmp_path, "write-hello", {"task.toml": f"{header}\n[agent]\ntimeout_sec = 30\n"})
    assert load_tasks(task)[0].timeout_s == 30.0
    assert capsys.readouterr().err == ""


def test_an_unknown_major_version_is_read_with_one_warning(tmp_path, capsys):
    task = task_copy(tmp_path, "write-hello", {"task.toml": 'version = "3.0"\n[agent]\ntimeout_sec = 30\n'})
    assert load_tasks(task)[0].timeout_s == 30.0
    assert capsys.readouterr().err == (f"polar: {task / 'task.toml'}: schema version '3.0' is newer than Polar "
                                       "knows (1/2.x): read as 2.x\n")


HARBOR_KEYS = """version = "2.0"
artifacts = ["/app/out.txt", "logs/run.log", { source = "/app", destination = "candidate" },
             { source = "/app/a.json", destination = "kept/a.json" }]
[agent]
user = "agent"
[verifier]
user = "root"
env = { STRICT = "yes", LEVEL = 3 }
[environment]
workdir = "/app/"
env = { GREETING = "hi", DEBUG = true }
storage_mb = 512
allow_internet = false
network_mode = "none"
gpus = 0
healthcheck = { command = "test -d /app", timeout_sec = 5 }
"""


def test_every_harbor_key_is_read(tmp_path):
    task = load_tasks(task_copy(tmp_path, "write-hello", {"task.toml": HARBOR_KEYS}))[0]
    assert (task.workdir, dict(task.env), task.storage_mb, task.wants_internet) == (
        "/app", {"GREETING": "hi", "DEBUG": "true"}, 512, False)
    assert dict(task.evaluator.env) == {"STRICT": "yes", "LEVEL": "3"}
    assert (task.healthcheck, task.healthcheck_timeout_s, task.artifacts) == ("test -d /app", 5.0, (
        ("out.txt", "out.txt"), ("logs/run.log", "logs/run.log"), (".", "candidate"), ("a.json", "kept/a.json")))
    assert task.metadata["harbor"]["storage_mb"] == 512
    assert type(task).from_dict(task.to_dict()) == task  # through sample.json and the manifest unchanged
    for asks in ("allow_internet = true", 'network_mode = "bridge"'):
        toml = HARBOR_KEYS.replace("allow_internet = false", asks) if "allow" in asks else \
            HARBOR_KEYS.replace('network_mode = "none"', asks)
        assert load_tasks(task_copy(tmp_path / asks[:5], "write-hello", {"task.toml": toml}))[0].wants_internet


def test_a_task_that_asks_for_the_internet_runs_its_agent_offline(tmp_path):
    """Refused before issue 66 ("the internet, which no sample gets here"); now it runs: its solve.sh (the agent's
    stage) offline, its verifier behind the egress proxy, or offline too with --run-offline."""
    toml = (HARBOR / "write-hello" / "task.toml").read_text().replace("cpus = 1", "cpus = 1\nallow_internet = true")
    task = task_copy(tmp_path, "write-hello", {"task.toml": toml})
    for n, extra in enumerate(([], ["--run-offline"])):
        done = polar("run", "--task", str(task), "--oracle", "--runtime", "bwrap", *extra,
                     "--out", str(tmp_path / f"o{n}"))
        assert done.returncode == 0 and "solve.sh exit 0, reward 1" in done.stdout, done.stdout + done.stderr
    done = polar("run", "--task", str(task), "--oracle", "--verifier-hosts", "http://pypi.org",
                 "--out", str(tmp_path / "o3"))
    assert done.returncode == 2 and "verifier hosts: 'http://pypi.org' is not a host name" in done.stderr


MIRROR_TEST = r"""#!/bin/bash
# terminal-bench style: fetch a tool, install it system-wide, then test (the reward to /logs/verifier)
cd /app || exit 1
python3 - <<'PY' || { echo "could not install checker"; echo 0 > /logs/verifier/reward.txt; exit 0; }
import os, urllib.request
data = urllib.request.urlopen("http://mirror.polar.test/tools/checker", timeout=20).read()
with open("/usr/local/bin/checker", "wb") as f:
    f.write(data)
os.chmod("/usr/local/bin/checker", 0o755)
PY
if checker && python3 -I -m pytest -q -p no:cacheprovider /tests/test_outputs.py; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
"""
# The agent's stage tries the verifier's way out and the mirror itself: both must fail.
MIRROR_SOLVE = r"""#!/bin/bash
echo ready > /app/status.txt
for url in http://127.0.0.1:3128 http://mirror.polar.test/tools/checker; do
  python3 -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=5)' "$url" 2>/dev/null \
    && echo "agent reached $url" || echo "agent offline for $url"
done
"""


def mirror_task(root: Path) -> Path:
    """A Harbor task that asks for the internet: its test.sh installs a tool from a package host into
    /usr/local/bin (root, a writable root) before its tests run."""
    task = root / "install-checker"
    for rel, text in {"instruction.md": "Write ready into /app/status.txt.\n",
                      "task.toml": 'version = "2.0"\n[environment]\nworkdir = "/app"\nallow_internet = true\n'
                                   'docker_image = "polar-tasks:local"\n[verifier]\ntimeout_sec = 60.0\n',
                      "solution/solve.sh": MIRROR_SOLVE, "tests/test.sh": MIRROR_TEST,
                      "tests/test_outputs.py": "from pathlib import Path\n\n\ndef test_status():\n"
                                               "    assert Path('/app/status.txt').read_text() == 'ready\\n'\n",
                      "environment/workspace/.keep": ""}.items():
        (task / rel).parent.mkdir(parents=True, exist_ok=True)
        (task / rel).write_text(text)
    return task


def test_a_verifier_installs_from_an_allowed_host_and_the_agent_reaches_nothing(tmp_path):
    """docker (root inside): the oracle's verifier fetches its tool through the egress proxy from an allowed
    stand-in host and installs it under /usr/local/bin (reward 1, the request logged); with --run-offline the
    same verifier cannot (reward 0, and Polar says its observer saw the tests pass); a host not on the list is
    refused and logged. solve.sh, the agent's stand-in, reaches neither the proxy nor the host."""
    require_engine()
    checker = b"#!/bin/sh\ngrep -qx ready /app/status.txt\n"
    task = mirror_task(tmp_path / "tasks")
    with stand_in_host(lambda path, _host: checker if path == "/tools/checker" else None) as (port, _asked):
        stand_in = f"mirror.polar.test=127.0.0.1:{port}"
        runs = {label: (polar("run", "--task", str(task), "--oracle", "--runtime", "docker", *flags,
                              "--out", str(tmp_path / label), timeout=600), tmp_path / label)
                for label, flags in (("online", ["--verifier-hosts", stand_in]), ("offline", ["--run-offline"]),
                                     ("elsewhere", ["--verifier-hosts", "pypi.org"]))}
    done, out = runs["online"]
    assert done.returncode == 0 and "solve.sh exit 0, reward 1" in done.stdout, done.stdout + done.stderr
    assert [(e["host"], e["allowed"]) for e in map(json.loads, (out / "egress.jsonl").read_text().splitlines())] \
        == [("mirror.polar.test", True)]
    for label, (done, out) in runs.items():
        agent = (out / "solve.stdout").read_text()
        assert agent.count("agent offline for") == 2 and "reached" not in agent, (label, agent)
    done, out = runs["offline"]
    assert done.returncode == 1 and "reward 0" in done.stdout and not (out / "egress.jsonl").exists()
    result = json.loads((out / "result.json").read_text())
    assert "Polar's observer saw every test pass, but test.sh wrote 0" in result["evaluator_output"], result
    done, out = runs["elsewhere"]
    assert done.returncode == 1 and "reward 0" in done.stdout
    assert [(e["host"], e["allowed"], e["why"]) for e in map(json.loads, (out / "egress.jsonl").read_text()
                                                           .splitlines())] == [
        ("mirror.polar.test", False, "not on the verifier's host list")]


def test_the_first_message_names_everything_the_node_lacks_at_once(tmp_path, monkeypatch):
    """A terminal-bench task on a bare node: a Docker Hub image and a GPU, each with its fix, in one message (not
    several tries); its allow_internet is no lack (the verifier's egress proxy, the agent offline)."""
    require_engine()
    monkeypatch.delenv("POLAR_PULL", raising=False)
    monkeypatch.delenv("POLAR_IMAGE_MAP", raising=False)
    image = f"polar-test-{uuid.uuid4().hex[:6]}/fix-git:20260403"
    task = task_copy(tmp_path, "write-hello", {"task.toml": f'[environment]\ndocker_image = "{image}"\n'
                                                            'allow_internet = true\ngpus = 64\n'})
    done = polar("run", "--task", str(task), "--runtime", "docker", "--adapter", "pi", "--out", str(tmp_path / "o"))
    assert done.returncode == 2 and not (tmp_path / "o").exists(), done.stderr
    assert done.stderr.splitlines() == [
        "polar run: task write-hello needs what this node lacks:",
        "  - 64 GPU(s) ([environment] gpus); this node has 0: run it on a GPU node",
        f"  - image {image} is not on this node: `podman pull docker.io/{image}` (or `load`) it here, set "
        "POLAR_PULL=missing to let samples pull it, or map it in POLAR_IMAGE_MAP (NAME=REF)"], done.stderr


def test_images_a_task_names(tmp_path):
    prebuilt = task_copy(tmp_path, "write-hello", {"task.toml": '[environment]\ndocker_image = "python:3.11-slim"\n'})
    assert load_tasks(prebuilt)[0].image == "python:3.11-slim"
    built = task_copy(tmp_path, "count-lines")
    (built / "environment").mkdir()
    (built / "environment" / "Dockerfile").write_text("FROM polar-tasks:local\nWORKDIR /app\n")
    image = load_tasks(built)[0].image
    assert image == str(built / "environment" / "Dockerfile") and names_oci_image(image)
    if shutil.which("podman") or shutil.which("docker"):
        assert resolve_runtime("auto", image) == "docker"


@pytest.mark.parametrize("files, where, message", [
    ({"instruction.md": None}, "instruction.md", "instruction: missing"),
    ({"instruction.md": "  \n"}, "instruction.md", "instruction: empty"),
    ({"task.toml": "[agent]\ntimeout_sec = -5\n"}, "task.toml", "agent.timeout_sec: expected a positive number of "
                                                                "seconds, got -5"),
    ({"task.toml": '[verifier]\ntimeout_sec = "soon"\n'}, "task.toml", "verifier.timeout_sec: expected a positive"),
    ({"task.toml": '[environment]\nworkdir = "app"\n'}, "task.toml", "environment.workdir: expected an absolute"),
    ({"task.toml": '[environment]\nworkdir = "/tmp/x"\n'}, "task.toml", "environment.workdir: /tmp/x: overlaps "
                                                                         "/tmp"),
    ({"task.toml": '[environment]\nworkdir = "/"\n'}, "task.toml", "environment.workdir: /: overlaps /"),
    ({"task.toml": '[environment]\nenv = { "1X" = "a" }\n'}, "task.toml", "environment.env: 1X = 'a': expected"),
    ({"task.toml": '[verifier]\nenv = "A=1"\n'}, "task.toml", "verifier.env: expected a table of variables"),
    ({"task.toml": '[environment]\nstorage_mb = -1\n'}, "task.toml", "environment.storage_mb: expected a positive"),
    ({"task.toml": '[environment]\ngpus = "two"\n'}, "task.toml", "environment.gpus: expected a number of GPUs"),
    ({"task.toml": '[environment]\nallow_internet = "no"\n'}, "task.toml", "environment.allow_internet: expected "
                                                                             "true or false"),
    ({"task.toml": '[environment]\nhealthcheck = 5\n'}, "task.toml", "environment.healthcheck: expected a shell"),
    ({"task.toml": '[agent]\nuser = ["a"]\n'}, "task.toml", "agent.user: expected a user name or id"),
    ({"task.toml": 'artifacts = ["/etc/passwd"]\n[environment]\nworkdir = "/app"\n'}, "task.toml",
     "artifacts: /etc/passwd: only paths in the workdir (/app) can be kept"),
    ({"task.toml": 'artifacts = [{ source = "/app" }]\n[environment]\nworkdir = "/app"\n'}, "task.toml",
     "artifacts: /app: the whole workdir needs a destination name"),
    ({"task.toml": 'artifacts = [{ source = "/app/x", destination = "../y" }]\n[environment]\nworkdir = "/app"\n'},
     "task.toml", "artifacts: ../y: expected a path inside the workdir"),
    ({"task.toml": 'artifacts = [{ source = "/app/x", exclude = ["*.o"] }]\n[environment]\nworkdir = "/app"\n'},
     "task.toml", "artifacts: {'source': '/app/x', 'exclude': ['*.o']}: Polar reads source and destination, not "
                  "exclude"),
    ({"task.toml": '[[steps]]\ninstruction = "a"\n'}, "task.toml", "steps[0].name: the step's name None is not"),
    ({"task.toml": "[agent\n"}, "task.toml", "toml: "),
    ({"task.toml": 'agent = "fast"\n'}, "task.toml", "agent: expected a table [agent]"),
    ({"task.toml": '[environment]\nmemory = "lots"\n'}, "task.toml", "environment.memory: expected a size"),
    ({"task.toml": '[environment]\nmemory_mb = 8\n'}, "task.toml", "environment.memory_mb: 8 MB: a sandbox needs"),
    ({"tests/test.sh": None}, "tests/test.sh", "tests: missing"),
])
def test_a_malformed_task_is_one_line_naming_file_and_field(tmp_path, files, where, message):
    task = task_copy(tmp_path, "write-hello")
    for rel, text in files.items():
        (task / rel).unlink() if text is None else (task / rel).write_text(text)
    with pytest.raises(TaskError) as e:
        load_tasks(tmp_path)  # the folder: the bad task is named in it
    assert str(e.value).startswith(f"{task / where}: {message}"), e.value
    if not message.startswith(("instruction: missing", "agent.timeout_sec")):
        return  # the two cases, also through the command line
    done = polar("run", "--task", str(task), "--adapter", "pi", "--out", str(tmp_path / "out"), timeout=60)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith(f"polar run: {task / where}: {message}") and not (tmp_path / "out").exists()


def test_a_folder_without_tasks_is_an_error(tmp_path):
    with pytest.raises(TaskError, match="no task.toml in it or in its subfolders"):
        load_tasks(tmp_path)


def test_rewards_read_from_the_verifier_logs(tmp_path):
    logs = tmp_path / "logs"
    (logs / "verifier").mkdir(parents=True)
    assert read_reward(logs) == (None, None, None)  # none written: the caller's 0
    (logs / "verifier" / "reward.txt").write_text("0.25\n")
    assert read_reward(logs) == (0.25, None, None)
    (logs / "verifier" / "reward.json").write_text('{"reward": 0.5, "style": 1}')
    assert "both reward.json and reward.txt" in read_reward(logs)[2]  # test.sh writes one: the other is forged
    (logs / "verifier" / "reward.txt").unlink()
    assert read_reward(logs) == (0.5, {"reward": 0.5, "style": 1.0}, None)
    (logs / "verifier" / "reward.json").write_text('{"accuracy": 0.75}')
    assert read_reward(logs) == (0.75, {"accuracy": 0.75}, None)  # a single entry is the reward
    (logs / "verifier" / "reward.json").write_text('{"a": 1, "b": 0}')
    assert "names no main `reward` among a, b" in read_reward(logs)[2]
    for text in ('{"reward": NaN}', '{"reward": 7}', '{"reward": -1}', '{"reward": 1, "style": Infinity}'):
        (logs / "verifier" / "reward.json").write_text(text)
        reward, _, problem = read_reward(logs)
        assert reward is None and problem, text  # the agent's code could have written it: 0, flagged
    (logs / "verifier" / "reward.json").unlink()
    os.symlink("/etc/hostname", logs / "verifier" / "reward.txt")
    assert read_reward(logs)[0] is None and "symlink" in read_reward(logs)[2]


def test_dockerfile_bases():
    text = "FROM --platform=linux/amd64 python:3.11 AS build\nRUN make\nFROM build\nFROM scratch\nFROM ${BASE}\n"
    assert dockerfile_bases(text) == ["python:3.11"]


def test_a_dockerfile_whose_base_is_not_here_names_it(tmp_path):
    engine = require_engine()
    dockerfile = tmp_path / "Dockerfile"
    dockerfile.write_text("FROM registry.invalid/nowhere:1\nRUN true\n")
    with pytest.raises(SandboxError, match=r"base image registry.invalid/nowhere:1 is not on this node"):
        build_dockerfile(engine, dockerfile)


def test_a_dockerfile_task_is_built_and_verified_in_its_container(tmp_path):
    """environment/Dockerfile from the demo image's local tag: built by the engine (no registry), the oracle and
    the verifier run in containers of it, the verifier sees what the build put in the image."""
    engine = require_engine()
    if engine.run(["image", "inspect", "polar-tasks:local"], check=False).returncode != 0:
        pytest.fail("no image polar-tasks:local (make setup imports it: scripts/setup_podman.sh)")
    task = task_copy(tmp_path, "write-hello", {"tests/test.sh": "grep -qx built /opt/marker && grep -qx hello "
                                                                "hello.txt && echo 1 > /logs/verifier/reward.txt\n"})
    (task / "environment").mkdir()
    (task / "environment" / "Dockerfile").write_text("FROM polar-tasks:local\nRUN echo built > /opt/marker\n")
    done = polar("run", "--task", str(task), "--oracle", "--out", str(tmp_path / "oracle"))
    assert done.returncode == 0 and "(docker): solve.sh exit 0, reward 1" in done.stdout, done.stdout + done.stderr


# -- the oracle and the verify stage ------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["fix-mul", "write-hello", "count-lines"])
def test_the_oracle_solves_each_task(tmp_path, name):
    done = polar("run", "--task", str(HARBOR), "--task-id", name, "--oracle", "--runtime", "bwrap",
                 "--out", str(tmp_path / "oracle"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "solve.sh exit 0, reward 1" in done.stdout
    if name == "count-lines":
        assert 'rewards: {"reward": 1.0, "exact": 1.0}' in done.stdout


def test_an_oracle_that_does_nothing_scores_zero(tmp_path):
    task = task_copy(tmp_path, "fix-mul", {"solution/solve.sh": "#!/bin/bash\ntrue\n"})
    done = polar("run", "--task", str(task), "--oracle", "--runtime", "bwrap", "--out", str(tmp_path / "oracle"))
    assert done.returncode == 1 and "solve.sh exit 0, reward 0" in done.stdout, done.stdout + done.stderr
    assert "2 failed" in (tmp_path / "oracle" / "evaluator.stdout").read_text()  # pytest's own verdict


def test_the_task_memory_bounds_its_sandbox(tmp_path):
    """memory_mb = 64: a solve.sh touching 300 MB is killed (the node's default, 4 GiB, would let it through)."""
    grab = 'python3 -c "b = bytearray(300 << 20); b[::4096] = b\\"x\\" * len(b[::4096])" || exit 9\n'
    task = task_copy(tmp_path, "write-hello", {"task.toml": "[environment]\nmemory_mb = 64\n",
                                               "solution/solve.sh": grab + "echo hello > hello.txt\n"})
    done = polar("run", "--task", str(task), "--oracle", "--runtime", "bwrap", "--out", str(tmp_path / "oracle"))
    assert done.returncode == 1 and "solve.sh exit 9, reward 0" in done.stdout, done.stdout + done.stderr
    assert "Killed" in (tmp_path / "oracle" / "solve.stderr").read_text()


def test_the_local_runtime_refuses_a_harbor_verifier(tmp_path):
    done = polar("run", "--task", str(HARBOR / "write-hello"), "--oracle", "--runtime", "local",
                 "--out", str(tmp_path / "oracle"))
    assert done.returncode == 1 and "local runtime: the task needs /solution inside the sandbox" in done.stderr


# -- real harnesses -----------------------------------------------------------------------------------------------
RUNS = {  # (task, adapter) -> expected reward and named rewards; Pi on every task: tests/workers/test_harbor_batch
    ("count-lines", "pi"): (1.0, {"reward": 1.0, "exact": 1.0}),
    ("fix-mul", "codex"): (1.0, None),
}


def polar_run(tmp: Path, tasks: Path, task_id: str, adapter: str, label: str, model: Path) -> tuple[Path, str]:
    out = tmp / f"{task_id}-{label}"  # a CA folder of its own: proxies started at once must not share one
    done = polar("run", "--task", str(tasks), "--task-id", task_id, "--adapter", adapter, "--runtime", "bwrap",
                 "--policy", str(POLICY), "--model", str(model), "--out", str(out),
                 "--confdir", str(tmp / f"mitm-{task_id}-{label}"), timeout=600)
    return out, done.stdout + done.stderr


@pytest.fixture(scope="module")
def runs(tmp_path_factory, long_model) -> dict[tuple[str, str], tuple[Path, str]]:
    tmp = tmp_path_factory.mktemp("harbor")
    peek = task_copy(tmp / "tasks", "fix-mul", {"instruction.md": "Look for the tests of mul.py.\n"})
    keys = [*RUNS, ("fix-mul", "peek")]
    with ThreadPoolExecutor(3) as pool:
        done = pool.map(lambda k: polar_run(tmp, peek.parent if k[1] == "peek" else HARBOR, k[0],
                                            "pi" if k[1] == "peek" else k[1], k[1], long_model), keys)
        return dict(zip(keys, done))


def result_of(out: Path, printed: str) -> SampleResult:
    assert (out / "result.json").is_file(), printed
    return SampleResult.from_dict(json.loads((out / "result.json").read_text()))


@pytest.mark.slow
@pytest.mark.parametrize("task_id, adapter", RUNS)
def test_a_harbor_task_through_polar_run(runs, task_id, adapter):
    out, printed = runs[(task_id, adapter)]
    result = result_of(out, printed)
    reward, named = RUNS[(task_id, adapter)]
    assert (result.status, result.failure, result.reward, result.weight) == ("completed", None, reward, 1.0), printed
    assert result.runtime == "bwrap" and result.calls >= 2, printed
    rows = read_trajectories(result.trajectories).to_pylist()
    assert rows and all(r["reward"] == reward for r in rows)
    metadata = json.loads(rows[0]["metadata"])["task"]
    assert metadata.get("rewards") == named and metadata["harbor"] is not None
    assert not (out / "workspace" / "tests").exists() and not (out / "workspace" / "test.sh").exists()


@pytest.mark.slow
def test_the_agent_sees_no_tests_and_no_solution(runs):
    out, printed = runs[("fix-mul", "peek")]
    result = result_of(out, printed)
    seen = (out / "workspace" / "peek.txt").read_text()
    assert seen.rstrip().endswith("end"), seen
    for path in ("/tests", "/solution", "/logs"):
        assert f"cannot access '{path}': No such file or directory" in seen, seen
    assert "test_mul.py" not in seen and "test.sh" not in seen and "solve.sh" not in seen
    assert (result.status, result.reward) == ("completed", 0.0), printed  # it fixed nothing: the tests say 0
