"""A multi-step Harbor task in one sample (docs/tasks.md "Multi-step tasks"): one sandbox and one workspace for
all its steps, and for each step its own session, harness run and verifier, in order (polar/tasks/steps.py says
what each step sees and how their rewards make the sample's).

  prepare_steps  (prepare)   the task's workspace copied in; each step's session registered and its harness
                             rendered now, while the adapter is at hand
  run_steps      (run)       per step: its files put into the workspace, its setup.sh and healthcheck run in the
                             agent's sandbox, its harness files written, the harness run, its session ended; each
                             step but the last verified at once, and a reward under its min_reward stops the task
  finish_steps   (evaluate)  the last step that ran verified (the agent's sandbox stopped first, as for one step),
                             then the sample's reward from the steps'

A step that times out ends the sample as a timeout (reward 0), as one step does. A step's setup.sh or
healthcheck failing is the environment's failure on the first step (error/infrastructure), and the step's 0
(named in `suspicious`) on a later one: the agent's earlier steps shaped what it runs on, and an agent must not
be able to turn its sample into a masked one. Each step's files (harness.json,
harness.stdout/stderr, the workspace snapshots, the verifier's output) are in <out>/steps/<n>-<name>/.
"""
from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Callable, Iterator

from polar.harness.render import Rendered
from polar.run.services import SessionLogin, new_session
from polar.run.session import (HarnessSetup, copy_workspace, exec_harness, harness_for, with_task_vars, write_ca,
                               write_harness)
from polar.run.state import SampleState
from polar.run.summary import WorkspaceTooLarge, changed_files, snapshot
from polar.sandbox.runtime import Sandbox
from polar.scoring.evaluation import script_failure
from polar.tasks.task import TaskSpec
from polar.tasks.steps import below_floor, put_step_files, step_session_id, step_task, task_reward, untouched_before
from polar_mitm.launch import ProxyProcess

# verify(state, task, before, after, folder, changed): the sample's verifier stage on the workspace as it is now
Verify = Callable[[SampleState, TaskSpec, dict[str, str], dict[str, str], Path, dict[str, list[str]]], None]


def prepare_steps(state: SampleState, setup: HarnessSetup, sandbox: Sandbox, proxy: ProxyProcess,
                  max_calls: int, sampling: dict | None) -> None:
    task, mounts = state.task, state.mounts
    copy_workspace(sandbox, mounts, task.workspace)
    endpoint = write_ca(proxy, mounts.shared)
    for i, step in enumerate(task.steps):
        session = new_session(proxy, task.task_id, step_session_id(state.sample_id, i), max_calls, sampling)
        state.steps.append({"name": step.name, "session": asdict(session)})
        state.save()  # ended by cleanup even if we die now
        step_setup = HarnessSetup(setup.adapter, step.instruction, setup.model, setup.way_in, setup.runtime,
                                  setup.tools_bin)
        rendered = harness_for(step_setup, mounts, session, endpoint)
        state.steps[-1].update(argv=list(rendered.argv), env=with_task_vars(rendered.env, task.env),
                               files={str(path): text for path, text in rendered.files.items()})


def run_steps(state: SampleState, sandbox: Sandbox, verify: Verify, end_session: Callable[[str, SessionLogin], None]
              ) -> None:
    """Each step in turn, until one times out, fails, or scores under its min_reward."""
    task, mounts, last = state.task, state.mounts, len(state.task.steps) - 1
    for i, (step, plan) in enumerate(zip(task.steps, state.steps)):
        folder = step_folder(state, i)
        folder.mkdir(parents=True, exist_ok=True)
        put_step_files(step, mounts.workspace)
        for what, script, timeout in (("setup.sh", step.setup, step.timeout_s),
                                      ("healthcheck", step.healthcheck, step.healthcheck_timeout_s)):
            failed = _failed(state, sandbox, what, script, timeout, folder) if script else None
            if failed and i == 0:  # before the agent did anything: the environment is not what the step expects
                state.fail("harness", f"step {step.name}: {failed}")
                return
            if failed:  # on a workspace the agent's earlier steps shaped: never a masked sample of its choosing
                state.suspicious.append(f"step {step.name}: its {failed}")
                _failed_by_agent(state, i, f"its {failed}")
                return
        session = SessionLogin(**plan["session"])
        try:
            write_harness(Rendered(tuple(plan["argv"]), plan["env"], {Path(p): t for p, t in plan["files"].items()}),
                          mounts, session, state.runtime, state.way_in, folder)
        except (ValueError, WorkspaceTooLarge) as e:  # the agent's doing: a link where the harness's config goes
            _failed_by_agent(state, i, str(e))
            return
        budget = min(step.timeout_s, state.session_left())
        result = exec_harness(sandbox, plan["argv"], plan["env"], mounts, state.proxy, budget, folder)
        end_session(f"session:{i + 1}", session)  # before its verifier: nothing of the agent calls on it now
        plan.update(exit_code=result.exit_code, timed_out=result.timed_out)
        state.exit_code, state.timed_out = result.exit_code, result.timed_out
        try:
            (folder / "workspace.after.json").write_text(json.dumps(snapshot(mounts.workspace)))
        except WorkspaceTooLarge as e:  # the agent made them (the start was snapshotted): nothing to verify on
            _failed_by_agent(state, i, str(e))
            return
        state.save()
        if result.timed_out or i == last:
            return  # the last step is verified by the evaluate stage, after the agent's sandbox is stopped
        verify_step(state, i, verify)
        if state.outcome is not None or _stopped(state, i):
            return


def finish_steps(state: SampleState, verify: Verify) -> None:
    """The last step that ran verified (unless it was already), then the sample's evaluation: the reward from
    the steps' by the task's strategy, each step's reward and named rewards for the rows."""
    ran = [plan for plan in state.steps if "exit_code" in plan]
    if ran and "evaluation" not in ran[-1]:
        verify_step(state, len(ran) - 1, verify)
        _stopped(state, len(ran) - 1)
    if state.outcome is not None:
        return
    rewards = [(plan.get("evaluation") or {}).get("reward") for plan in ran]
    last = (ran[-1].get("evaluation") or {}) if ran else {}
    state.evaluation = {"reward": task_reward(state.task.step_reward, rewards, len(state.task.steps)),
                        "output": last.get("output", ""), "steps": step_results(state)}


def verify_step(state: SampleState, i: int, verify: Verify) -> None:
    """Step i's verifier on the workspace now: the ground is the pristine workspace through this step, and what the
    agent changed in any step comes in through the allowlist (polar/tasks/steps.py)."""
    folder, plan = step_folder(state, i), state.steps[i]
    starts = [_read(step_folder(state, j) / "workspace.before.json") for j in range(i + 1)]
    ends = [_read(step_folder(state, j) / "workspace.after.json") for j in range(i + 1)]
    tampered = set(state.tampered)
    state.evaluation = None
    verify(state, step_task(state.task, i), untouched_before(starts, ends, ends[i]), ends[i], folder,
           changed_files(starts[i], ends[i]))
    plan["evaluation"] = state.evaluation
    state.tampered = sorted(tampered | set(state.tampered))  # what any step's verifier dropped
    state.save()


def step_results(state: SampleState) -> list[dict]:
    """name, reward (None: not run or not scored), named rewards and why the task stopped there, per step."""
    out = []
    for plan in state.steps:
        evaluation = plan.get("evaluation") or {}
        out.append({"name": plan["name"], "reward": evaluation.get("reward"), "rewards": evaluation.get("rewards"),
                    "ran": "exit_code" in plan, "timed_out": bool(plan.get("timed_out")),
                    **({"stopped": plan["stopped"]} if plan.get("stopped") else {})})
    return out


def step_sessions(state: SampleState) -> Iterator[tuple[str, SessionLogin]]:
    """(cleanup key, session) of every step."""
    for i, plan in enumerate(state.steps):
        if plan.get("session"):
            yield f"session:{i + 1}", SessionLogin(**plan["session"])


def step_folder(state: SampleState, i: int) -> Path:
    return state.out / "steps" / f"{i + 1}-{state.task.steps[i].name}"


def _failed_by_agent(state: SampleState, i: int, why: str) -> None:
    """Step i scores 0 and stops the task, for what the agent did to its workspace."""
    plan = state.steps[i]
    plan.setdefault("exit_code", None)
    plan.update(evaluation={"reward": 0.0, "output": f"[polar] {why}: reward 0"},
                stopped=f"step {plan['name']}: {why}")
    state.save()


def _stopped(state: SampleState, i: int) -> bool:
    """Whether step i's reward stops the task (recorded as the step's `stopped`)."""
    evaluation = state.steps[i].get("evaluation") or {}
    why = below_floor(state.task.steps[i], evaluation.get("reward"), evaluation.get("rewards"))
    if why:
        state.steps[i]["stopped"] = why
        state.save()
    return why is not None


def _failed(state: SampleState, sandbox: Sandbox, what: str, script: str, timeout: float, folder: Path
            ) -> str | None:
    """A step's setup.sh or healthcheck in the agent's sandbox, in the workdir: None when it passed, else how it
    failed."""
    failed = script_failure(sandbox, state.mounts, state.task.env, ["bash", "-c", script], timeout,
                            folder / what.replace(".sh", ""))
    return f"{what} {failed}".rstrip(": ") if failed else None


def _read(path: Path) -> dict[str, str]:
    return json.loads(path.read_text()) if path.exists() else {}
