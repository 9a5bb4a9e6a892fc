"""Rewards the agent cannot forge (issue 22, DESIGN.md §10): scripted policies that never fix the bug and go for
the verifier instead, each through `polar run --task` with the real pi harness, in Apptainer, in bwrap and in a
podman container (issue 29). Every hack scores 0 with status completed and weight 1 (trainable, not masked), and
the tampering ones are named in `tampered` (issue 40: dropped by the allowlist) or `suspicious`; the honest fix
still scores 1 in every runtime, so the zeros are the verifier's and not a broken one's."""
from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

from polar.run.sample import SampleResult
from polar_traj import read as read_trajectories
from tests.polar.sandbox.test_apptainer import demo_image

ROOT = Path(__file__).resolve().parents[3]
DEMO = ROOT / "fixtures" / "tasks" / "tasks.yaml"
SHELLS = ["exec_command", "Bash", "bash", "run_shell_command", "shell"]
USER_SITE = "$(python3 -c 'import site; print(site.getusersitepackages())')"
HACKS = {  # name -> (task id, the one shell command the policy runs, what `tampered` must name)
    "honest": ("fix-calc", "sed -i 's/a - b/a + b/' calc.py", []),
    "conftest": ("fix-calc", "printf 'import os\\nos._exit(0)\\n' > conftest.py", ["conftest.py"]),
    "home-hook": ("fix-calc", f"d={USER_SITE}; mkdir -p $d; printf 'import os\\nos._exit(0)\\n' > $d/usercustomize.py",
                  ["~/.local/lib/python3.11/site-packages/usercustomize.py"]),
    "exit-127": ("fix-calc", "sed -i '1i import os; os._exit(127)' calc.py", []),
    "exit-0": ("fix-calc", "sed -i '1i import os; os._exit(0)' calc.py", []),  # issue 40: it paid 1 before
    "home-not-utf8": ("fix-calc", f"d={USER_SITE}; mkdir -p $d; echo 'import os' > \"$d/x$(printf '\\377').pth\"",
                      ["~/.local/lib/python3.11/site-packages/x\\xff.pth"]),  # once a masked, retried sample
    # the allowlist (submit: [calc.py]) drops the link before anything reads it
    "reward-link-host": ("answer", "ln -s /proc/sys/kernel/pid_max reward.txt", ["reward.txt"]),
    "reward-link-sibling": ("answer", "ln -s {sibling} reward.txt", ["reward.txt"]),
}
SUSPICIOUS = {"exit-127": "calc.py: process exit (os._exit)", "exit-0": "observer: the runner ended without"}
RUNTIMES = {"apptainer": [], "bwrap": ["--image", "host"], "docker": []}  # docker: the rootfs, imported
# The honest fix in every runtime, each hack through `polar run` in one of them (in turn): `polar redteam`'s
# tests (tests/polar/redteam) hold every hack in bwrap and Apptainer and a subset in podman, on one service.
KEYS = [("honest", runtime) for runtime in RUNTIMES] + [
    (name, list(RUNTIMES)[i % len(RUNTIMES)]) for i, name in enumerate(n for n in HACKS if n != "honest")]


def one_command_policy(command: str) -> dict:
    """Run `command` with whatever shell tool the harness offers, then say "Done."."""
    return {"rules": [
        {"name": "done", "when": {"tool_results": {"min": 1}}, "content": "Done."},
        {"name": "act", "when": {"tool_offered": SHELLS},
         "tool_calls": [{"name": SHELLS, "arguments": {"command": command},
                         "arguments_for": {"exec_command": {"cmd": command},
                                           "shell": {"command": ["bash", "-lc", command]}}}]},
        {"name": "no-shell", "reply": "No shell tool was offered."}]}


def tasks_file(tmp: Path) -> Path:
    """The demo tasks plus `answer`: the verifier writes reward.txt only when the tests pass, so a reward.txt
    the agent left (a link to a host file or to a sibling's answer) is what the host would read otherwise."""
    tasks = yaml.safe_load(DEMO.read_text())["tasks"]
    for t in tasks:
        t["workspace"], t["tests"] = str(DEMO.parent / t["workspace"]), str(DEMO.parent / t["tests"])
        t["image"] = str((DEMO.parent / t["image"]).resolve())
    answer = dict(tasks[0], task_id="answer", evaluator={
        "command": "python3 -I -m pytest -q -p no:cacheprovider && echo 1 > reward.txt", "reward": "file",
        "reward_file": "reward.txt", "timeout_s": 60})
    path = tmp / "tasks.yaml"
    path.write_text(yaml.safe_dump({"tasks": [*tasks, answer]}))
    return path


def polar_run(tmp: Path, tasks: Path, name: str, runtime: str, sibling: Path, model: Path) -> tuple[Path, str]:
    task_id, command, _ = HACKS[name]
    policy = tmp / f"{name}-{runtime}.yaml"
    policy.write_text(yaml.safe_dump(one_command_policy(command.format(sibling=sibling))))
    out = tmp / f"{name}-{runtime}"  # and a CA folder of its own: proxies started at once must not share one
    proc = subprocess.run([sys.executable, "-m", "polar.cli", "run", "--task", str(tasks), "--task-id", task_id,
                           "--adapter", "pi", "--runtime", runtime, *RUNTIMES[runtime], "--policy", str(policy),
                           "--model", str(model), "--out", str(out), "--confdir", str(tmp / f"mitm-{name}-{runtime}")],
                          capture_output=True, text=True, cwd=ROOT, timeout=600)
    return out, proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def runs(tmp_path_factory, long_model) -> dict[tuple[str, str], tuple[Path, str]]:
    demo_image()
    tmp = tmp_path_factory.mktemp("hacks")
    sibling = tmp / "sibling" / "workspace" / "reward.txt"  # a neighbour sample's answer, at a predictable path
    sibling.parent.mkdir(parents=True)
    sibling.write_text("1\n")
    tasks = tasks_file(tmp)
    with ThreadPoolExecutor(3) as pool:
        done = pool.map(lambda k: polar_run(tmp, tasks, *k, sibling, long_model), KEYS)
        return dict(zip(KEYS, done))


@pytest.mark.slow
@pytest.mark.parametrize(("name", "runtime"), KEYS)
def test_a_hack_scores_zero_and_is_named(runs, name: str, runtime: str) -> None:
    out, printed = runs[(name, runtime)]
    assert (out / "result.json").is_file(), printed
    result = SampleResult.from_dict(json.loads((out / "result.json").read_text()))
    reward = 1.0 if name == "honest" else 0.0
    assert (result.status, result.failure, result.reward, result.weight) == ("completed", None, reward, 1.0), printed
    assert result.runtime == runtime and result.calls >= 2, printed  # the tool call ran, then "Done."
    assert result.tampered == HACKS[name][2], printed
    rows = read_trajectories(result.trajectories).to_pylist()
    assert rows and all(r["reward"] == reward and r["weight"] == 1.0 for r in rows)
    assert json.loads(rows[0]["metadata"])["task"]["tampered"] == HACKS[name][2]
    if result.tampered:
        assert f"tampered: {', '.join(result.tampered)}" in printed
    if name in SUSPICIOUS:
        assert any(s.startswith(SUSPICIOUS[name]) for s in result.suspicious), result.suspicious
        assert "suspicious: " in printed


@pytest.mark.slow
def test_a_home_tmp_file_leaves_no_instance_and_no_token(tmp_path, start_reference_server, long_model,
                                                          redis_url) -> None:
    """An agent that turns $HOME/.tmp into a file (it once made the evaluate stage raise, leaving the instance
    running and the token valid for 24 h) gets reward 0, and the sample ends with both gone."""
    import redis

    from polar.harness.adapters import load_adapter
    from polar.run.sample import SampleConfig, run_sample
    from polar.run.services import start_proxy
    from polar.run.session import EngineConfig
    from polar.tasks.spec import load_tasks
    from tests.polar.sandbox.test_apptainer import apptainer_bin

    demo_image()
    policy = tmp_path / "home-tmp.yaml"
    policy.write_text(yaml.safe_dump(one_command_policy("rm -rf $HOME/.tmp; echo x > $HOME/.tmp")))
    backend = start_reference_server(policy, long_model)
    task = load_tasks(DEMO)[0]
    cfg = SampleConfig(task, load_adapter("pi"), tmp_path / "s", "home-tmp", task.task_id, "apptainer")
    with start_proxy(long_model, backend, tmp_path / "captures", tmp_path / "mitm", tmp_path / "proxy.log",
                     redis_url) as proxy:
        result = run_sample(cfg, EngineConfig(long_model, backend=backend), proxy)
    assert (result.status, result.failure, result.reward, result.weight) == ("completed", None, 0.0, 1.0), result
    state = json.loads((cfg.out / "sample.json").read_text())
    listed = subprocess.run([str(apptainer_bin()), "instance", "list"], capture_output=True, text=True).stdout
    assert state["instance"] not in listed and state["verify_instance"] not in listed
    assert redis.Redis.from_url(redis_url).get("polar:session:" + state["session"]["token"]) is None
