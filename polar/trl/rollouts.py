"""Polar as a trainer's rollout source: submit groups to the rollout service (PolarClient), wait, and turn the
finished groups' Parquet rows into what a GRPO step consumes: prompt and response ids, the loss mask as the
completion mask, the recorded behaviour logprobs as old logprobs, rewards, advantages and policy versions.

    rollouts = PolarRollouts(client, Path("tasks.yaml"), RolloutConfig(group_size=4, out=Path("runs/trl")))
    step = rollouts.collect(["vowels-0", "vowels-1"])       # blocks until both groups are final
    step.rows[0].response_ids, step.rows[0].old_logprobs, step.rows[0].advantage

`PolarRollouts.trl_rollout_func()` is the same, shaped for `trl.GRPOTrainer(rollout_func=…)`."""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

from polar.trl.correction import staleness_mask


@dataclass(frozen=True)
class RolloutConfig:
    group_size: int
    out: Path  # the batches' root (storage every node sees)
    sampling: dict[str, Any] = field(default_factory=lambda: {"temperature": 1.0, "max_tokens": 16})
    # a call made more than this many versions before the trainer's current one is not trained on (its tokens
    # masked, counted per step); a row left with no call to train is dropped. None: no limit
    max_staleness: int | None = None
    timeout_s: float = 600.0
    # submit the next step's batch as soon as this one is collected, so it runs while the trainer trains and
    # syncs (its rows are then mostly one version behind: off-policy for a trainer without a correction)
    overlap: bool = False


@dataclass(frozen=True)
class Row:
    """One trajectory as a trainer sees it (response side: ids, mask and logprobs of equal length)."""
    trajectory_id: str
    task_id: str
    group_id: str
    prompt_ids: list[int]
    response_ids: list[int]
    loss_mask: list[int]  # 1 = sampled by the policy (trained), 0 = tool results and template between calls
    old_logprobs: list[float]  # the behaviour policy's, as the engine recorded them; 0.0 where the mask is 0
    reward: float | None
    advantage: float | None
    weight: float  # 0: masked by Polar (infrastructure failure), never trained on
    policy_version_min: int | None
    policy_version_max: int | None
    stale: bool  # not trained: every call too old for the trainer (or Polar's mark, for rows without calls' spans)
    # per call: [start, end) of its sampled tokens in response_ids and its policy version (metadata.call_outputs)
    call_outputs: tuple[tuple[int, int, int | None], ...] = ()

    @property
    def usable(self) -> bool:
        return self.weight > 0 and not self.stale and bool(self.response_ids)


@dataclass(frozen=True)
class StepRollouts:
    batch_id: str
    rows: list[Row]  # grouped: each group's rows together, groups in the order asked for
    wait_s: float  # submit to the last group final
    trainer_version: int = 0  # the policy version the trainer held when it collected them
    masked_calls: int = 0  # calls older than max_staleness, their tokens masked

    @property
    def usable(self) -> list[Row]:
        return [r for r in self.rows if r.usable]

    def reward_mean(self) -> float:
        rewards = [r.reward for r in self.usable if r.reward is not None]
        return sum(rewards) / len(rewards) if rewards else float("nan")

    def signal(self) -> tuple[int, int]:
        """(groups whose usable rows' rewards differ, groups): GRPO's advantages are zero in the others, so a step
        where no group differs teaches nothing."""
        rewards: dict[str, set[float]] = {}
        for row in self.rows:
            rewards.setdefault(row.group_id, set())
            if row.usable and row.reward is not None:
                rewards[row.group_id].add(row.reward)
        return sum(len(r) > 1 for r in rewards.values()), len(rewards)

    def versions(self) -> set[int]:
        return {v for r in self.usable for v in (r.policy_version_min, r.policy_version_max) if v is not None}

    def lag(self, row: Row) -> int | None:
        """Versions between the row's oldest call and the trainer (None: no call reported one)."""
        return None if row.policy_version_min is None else self.trainer_version - row.policy_version_min


def _version(value: Any) -> int | None:
    return None if value is None or value != value else int(value)  # NaN: a row without calls


def row_from_record(rec: dict[str, Any]) -> Row:
    """A trajectory-table row (docs/design.md §4) as a Row."""
    meta = json.loads(rec.get("metadata") or "{}")
    reward, advantage = rec.get("reward"), rec.get("advantage")
    return Row(str(rec["trajectory_id"]), str(rec["task_id"]), str(rec["group_id"]),
               [int(t) for t in rec["prompt_ids"]], [int(t) for t in rec["response_ids"]],
               [int(m) for m in rec["loss_mask"]], [float(x) for x in rec["logprobs"]],
               None if reward is None or reward != reward else float(reward),
               None if advantage is None or advantage != advantage else float(advantage),
               float(rec["weight"]), _version(rec.get("policy_version_min")),
               _version(rec.get("policy_version_max")), bool(meta.get("stale", False)),
               tuple((int(a), int(b), _version(v)) for a, b, v in meta.get("call_outputs") or ()))


class PolarRollouts:
    """Submits one batch per training step: the step's tasks of a tasks source (a YAML or JSONL tasks file, a
    Harbor task directory or a folder of them: what `polar submit` takes), `group_size` samples each, every task's
    harness replaced by `adapter` when given."""

    def __init__(self, client: Any, tasks: Path, config: RolloutConfig, adapter: str | None = None) -> None:
        from polar.tasks.load import load_tasks

        self.client, self.config, self.source, self.adapter = client, config, Path(tasks), adapter
        self.task_ids = [t.task_id for t in load_tasks(self.source)]  # a broken source fails here, not mid-run
        self.submitted = 0  # batches so far
        self.model_version = 0  # the trainer's policy version, for max_staleness
        self._ahead: tuple[list[str], Any] | None = None  # overlap: (task ids, batch) submitted for next step

    def stop(self) -> None:
        """Cancel the batch submitted ahead, if any (the end of training)."""
        if self._ahead is not None:
            self._ahead[1].cancel()
            self._ahead = None

    def update_model_version(self, model_version: int) -> None:
        """The version the engines now serve (TRL's rollout-worker protocol has the same method)."""
        self.model_version = model_version

    def check_health(self, stale_after_s: float = 0.0) -> None:
        """RuntimeError when no rollout node is alive (TRL's rollout-worker protocol has the same method)."""
        nodes = self.client.nodes()
        if not any(n.state == "alive" for n in nodes):
            raise RuntimeError("no rollout node is alive: " + ("; ".join(n.line() for n in nodes) or "none ever beat"))

    def too_old(self, row: Row) -> bool:
        limit, first = self.config.max_staleness, row.policy_version_min
        return limit is not None and first is not None and self.model_version - first > limit

    def apply_staleness(self, row: Row) -> tuple[Row, int]:
        """The row as the trainer may train it, and the calls masked: each call older than max_staleness
        versions has its tokens masked; a row left with none is stale. This per-call rule replaces Polar's
        row mark (metadata.stale: calls spanning versions), which would drop a row's fresh calls with its
        old ones. A row without call spans (written before them) goes by its oldest call."""
        if self.config.max_staleness is None:
            return row, 0
        if not row.call_outputs:
            return (replace(row, stale=True) if self.too_old(row) else row), 0
        mask, masked = staleness_mask(row.loss_mask, row.call_outputs, self.model_version, self.config.max_staleness)
        return replace(row, loss_mask=mask, stale=not any(mask)), masked

    def _submit(self, task_ids: list[str]) -> Any:
        batch = self.client.submit(self.source, group_size=self.config.group_size, adapter=self.adapter,
                                   out=self.config.out, max_staleness=self.config.max_staleness,
                                   sampling=self.config.sampling, task_ids=task_ids)
        self.submitted += 1
        return batch

    def collect(self, task_ids: list[str]) -> StepRollouts:
        """Run one group per task id and return every row once, grouped in that order; KeyError for an unknown
        task, TimeoutError when the batch does not finish in `timeout_s`. With `overlap`, the batch submitted
        ahead for these task ids is used, and the next one goes out before this returns."""
        t0 = time.monotonic()
        ahead, self._ahead = self._ahead, None
        batch = ahead[1] if ahead is not None and ahead[0] == task_ids else self._submit(task_ids)
        if ahead is not None and ahead[1] is not batch:
            ahead[1].cancel()
        try:
            batch.wait(timeout=self.config.timeout_s, poll_s=0.2)
        except TimeoutError:
            batch.cancel()  # its samples would otherwise keep the nodes busy past this step
            raise
        records = batch.trajectories().to_dict("records")
        by_task: dict[str, list[Row]] = {}
        masked_calls = 0
        for rec in records:
            row, masked = self.apply_staleness(row_from_record(rec))
            masked_calls += masked
            by_task.setdefault(row.task_id, []).append(row)
        rows = [r for t in task_ids for r in sorted(by_task.get(t, []), key=lambda r: r.trajectory_id)]
        if self.config.overlap:
            self._ahead = (list(task_ids), self._submit(task_ids))
        return StepRollouts(batch.batch_id, rows, time.monotonic() - t0, self.model_version, masked_calls)

    def trl_rollout_func(self, on_rollouts: Callable[[StepRollouts, Any], None] | None = None
                         ) -> Callable[[list[Any], Any], dict[str, list]]:
        """A `rollout_func(prompts, trainer)` for trl.GRPOTrainer: its prompts are task ids, each repeated
        num_generations times in a row (TRL's sampler). Returns one completion per prompt, in order: the
        response ids, `env_mask` = the loss mask, the recorded logprobs, and Polar's reward and advantage as
        extra fields (for a reward function). A masked (weight 0) or stale row keeps its place with an
        all-zero env_mask and reward None, which TRL leaves out of the group baseline and gives advantage 0.
        `on_rollouts(step, trainer)` sees each step's rollouts first (fidelity checks, progress)."""
        def rollout_func(prompts: list[Any], trainer: Any) -> dict[str, list]:
            g = self.config.group_size
            task_ids = [str(p) for p in prompts[::g]]
            if [str(p) for p in prompts] != [t for t in task_ids for _ in range(g)]:
                raise ValueError(f"expected each prompt {g} times in a row (num_generations = group_size)")
            step = self.collect(task_ids)
            if on_rollouts is not None:
                on_rollouts(step, trainer)
            return trl_fields(step, task_ids, g)

        return rollout_func


def trl_fields(step: StepRollouts, task_ids: list[str], group_size: int) -> dict[str, list]:
    """The rows laid out as GRPOTrainer's rollout_func output; ValueError when a group is not `group_size`
    rows (a sample whose calls did not merge into one trajectory: GRPOTrainer wants one completion each)."""
    out: dict[str, list] = {k: [] for k in ("prompt_ids", "completion_ids", "logprobs", "env_mask",
                                            "polar_reward", "polar_advantage", "policy_version")}
    for task_id in task_ids:
        rows = [r for r in step.rows if r.task_id == task_id]
        if len(rows) != group_size:
            raise ValueError(f"batch {step.batch_id}: group {task_id} has {len(rows)} trajectories, "
                             f"expected {group_size}")
        for r in rows:
            usable = r.usable
            out["prompt_ids"].append(r.prompt_ids)
            out["completion_ids"].append(r.response_ids or [0])
            out["logprobs"].append(r.old_logprobs or [0.0])
            out["env_mask"].append(r.loss_mask if usable else [0] * max(1, len(r.response_ids)))
            out["polar_reward"].append(r.reward if usable else None)
            out["polar_advantage"].append(r.advantage)
            out["policy_version"].append(r.policy_version_max)
    return out


def polar_reward(completions: list[Any], polar_reward: list[float | None], **_: Any) -> list[float | None]:
    """GRPOTrainer reward function: the reward Polar's evaluator gave each sample (None: masked)."""
    return list(polar_reward)
