"""The README's commands run as written (issue 26 item 7): every block after a `<!-- runnable -->` mark is run,
in the order it appears, in one fresh folder that sees the repo's fixtures/ and adapters/ (like a checkout's
root); a `<!-- runnable: NAME -->` block is the file NAME that the blocks after it use. Inside `make test`'s
loopback-only namespace, so nothing a harness does reaches past 127.0.0.1."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BLOCK = re.compile(r"<!-- runnable(?:: (?P<file>[\w.-]+))? -->\n```(?P<lang>\w+)\n(?P<body>.*?)\n```", re.S)
REWARD_1 = re.compile(r"\breward 1(?:,|$)", re.M)  # a sample's "reward 1, weight 1", an oracle's "reward 1"


def runnable_blocks(text: str) -> list[tuple[str | None, str, str]]:
    return [(m["file"], m["lang"], m["body"]) for m in BLOCK.finditer(text)]


def test_the_readme_marks_blocks_to_run() -> None:
    blocks = runnable_blocks((ROOT / "README.md").read_text())
    assert sum(f is None for f, _, _ in blocks) >= 2 and all(lang in ("sh", "yaml") for _, lang, _ in blocks)


@pytest.mark.slow
def test_the_readmes_runnable_blocks_run_as_written(tmp_path: Path) -> None:
    for name in ("fixtures", "adapters"):
        (tmp_path / name).symlink_to(ROOT / name)
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    ran = 0
    for file, lang, body in runnable_blocks((ROOT / "README.md").read_text()):
        if file:
            (tmp_path / file).write_text(body + "\n")
            continue
        proc = subprocess.run(["bash", "-euo", "pipefail", "-c", body], cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=900)
        printed = proc.stdout + proc.stderr
        assert proc.returncode == 0, f"README block failed (exit {proc.returncode}):\n{body}\n---\n{printed[-4000:]}"
        assert "Traceback" not in printed and "status error" not in printed, printed[-4000:]
        if "--task " in body:  # each `polar run` of a task scores it: a sample's "reward 1, weight 1", an oracle's
            assert len(REWARD_1.findall(printed)) == body.count("polar run"), printed[-4000:]
        ran += 1
    assert ran >= 2


SERVICE = re.compile(r"<!-- (?P<kind>service|on-service) -->\n```(?P<lang>\w+)\n(?P<body>.*?)\n```", re.S)
PORT = re.compile(r"(?<=localhost:)\d+|(?<=127\.0\.0\.1:)\d+|(?<=--port )\d+")


def service_blocks(text: str) -> list[tuple[str, str, str]]:
    return [(m["kind"], m["lang"], m["body"]) for m in SERVICE.finditer(text)]


def free_ports(texts: list[str]) -> dict[str, str]:
    """Each port the README names -> a free one here (the suite runs in parallel)."""
    from polar_mitm.launch import free_port

    return {p: str(free_port()) for p in sorted({p for t in texts for p in PORT.findall(t)})}


def wait_until(ok, proc: subprocess.Popen, log: Path, what: str, timeout_s: float = 240.0) -> None:
    import time

    deadline = time.monotonic() + timeout_s
    while not ok():
        assert proc.poll() is None and time.monotonic() < deadline, f"{what}:\n{log.read_text()[-3000:]}"
        time.sleep(0.3)


@pytest.mark.slow
def test_the_readmes_api_example_runs_on_its_own_entry_points(tmp_path: Path) -> None:
    """The README's service block (engine, `python -m polar.rollout_server`, `python -m polar.gateway`) started as
    written, then its curl (no Content-Type) and HTTP PolarClient blocks against it, and docs/api.md's TaskRequest
    curl and SDK block (its `tasks.yaml`: the demo's fix-calc): each batch's two samples score 1."""
    import signal
    import socket
    import time

    import httpx

    import shutil

    for name in ("tasks", "policies", "tiny-qwen2"):  # copied: the API takes task paths only under its cwd
        shutil.copytree(ROOT / "fixtures" / name, tmp_path / "fixtures" / name, symlinks=True)
    blocks = service_blocks((ROOT / "README.md").read_text())
    assert [k for k, _, _ in blocks] == ["service", "on-service", "on-service"]
    docs = service_blocks((ROOT / "docs" / "api.md").read_text())
    assert [(k, lang) for k, lang, _ in docs] == [("on-service", "sh"), ("on-service", "python")]
    (tmp_path / "tasks.yaml").write_text(json.dumps({"tasks": [{
        "task_id": "fix-calc", "instruction": "Fix the bug in calc.py.", "workspace": "fixtures/tasks/calc",
        "tests": "fixtures/tasks/tests/calc", "submit": ["calc.py"], "image": "host",
        "evaluator": {"pytest": ["tests/test_calc.py"]}}]}))
    ports = free_ports([b for _, _, b in blocks + docs])
    local = lambda text: PORT.sub(lambda m: ports[m[0]], text)  # noqa: E731
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    procs: list[subprocess.Popen] = []
    try:
        for i, line in enumerate(l for l in local(blocks[0][2]).splitlines() if l.strip()):
            if line.startswith("export "):
                name = line.split()[1].split("=")[0]
                env[name] = subprocess.run(["bash", "-c", f"{line}; printf %s \"${name}\""], capture_output=True,
                                           text=True, check=True).stdout
                continue
            log = tmp_path / f"service{i}.log"
            with open(log, "wb") as out:
                procs.append(subprocess.Popen(["bash", "-c", f"exec {line}"], cwd=tmp_path, env=env, stdout=out,
                                              stderr=subprocess.STDOUT, start_new_session=True))
            if "polar.gateway" in line:
                api = f"http://127.0.0.1:{PORT.findall(line)[0]}"
                status = lambda: httpx.get(f"{api}/rollout/status", timeout=10,  # noqa: E731
                                           headers={"authorization": f"Bearer {env['POLAR_API_TOKEN']}"}).text
                wait_until(lambda: '"alive"' in status(), procs[-1], log, "the gateway's node never came up")
            else:
                port = int(PORT.findall(line)[-1])
                wait_until(lambda: socket.socket().connect_ex(("127.0.0.1", port)) == 0, procs[-1], log,
                           f"{line} did not listen")
        printed = []
        for _, lang, body in blocks[1:] + docs:
            cmd = ["bash", "-euo", "pipefail", "-c", local(body)] if lang == "sh" else [sys.executable, "-c", local(body)]
            proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
            assert proc.returncode == 0 and "Traceback" not in proc.stderr, f"{body}\n---\n{proc.stdout}{proc.stderr}"
            printed.append(proc.stdout)
        auth = {"authorization": f"Bearer {env['POLAR_API_TOKEN']}"}
        for batch in (json.loads((tmp_path / "batch.json").read_text())["batch_id"], json.loads(printed[2])["id"]):
            deadline = time.monotonic() + 300
            while not (status := httpx.get(f"{api}/api/batches/{batch}", headers=auth).json())["settled"]:
                assert time.monotonic() < deadline, status
                time.sleep(0.5)
            assert [s["reward"] for s in status["samples"].values()] == [1.0, 1.0], status
        sdk = [line.split() for line in printed[3].splitlines() if "fix-calc" in line]  # index, task_id, reward
        assert len(sdk) >= 2 and all(row[-1] == "1.0" for row in sdk), printed[3]
        truncated = httpx.post(f"{api}/api/tasks", content=b'{"harness": "pi", "group_size": 2, "task', headers=auth)
        assert truncated.status_code == 422 and truncated.json()["field"] == "body", truncated.text
    finally:
        for proc in reversed(procs):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(15)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(10)


def test_the_entry_points_say_the_missing_token_in_one_line() -> None:
    env = {k: v for k, v in os.environ.items() if k != "POLAR_API_TOKEN"}
    for module, args in (("polar.rollout_server", []), ("polar.gateway", ["--rollout_server", "127.0.0.1:0",
                                                                        "--inference_server", "127.0.0.1:0"])):
        proc = subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=120)
        assert proc.returncode == 2 and "POLAR_API_TOKEN" in proc.stderr and len(proc.stderr.splitlines()) == 1
