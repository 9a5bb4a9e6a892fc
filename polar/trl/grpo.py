"""A GRPO run with TRL's `GRPOTrainer` fed by Polar: each step's rollouts come from the rollout service
(`rollout_func`), each optimizer step's weights reach the engine through the fence (a callback running
FenceWeightTransfer.push), and every step is checked and reported: the trainer's logprobs of the recorded tokens
before its update (they must equal the engine's), the importance ratio after it, the policy versions the rows
carry, rollout wait, train and sync time.

TRL 1.16's seams: `GRPOTrainer(rollout_func=…)` runs on a CPU; `trl.experimental.async_grpo.AsyncGRPOTrainer`
(rollout_worker=, weight_transfer=) needs the flash-attn3 kernel for its tree packing, so a GPU. FenceWeightTransfer
implements that trainer's weight-transfer protocol too. Without vLLM, GRPOTrainer takes its own detached logprobs
as the old ones (on-policy); this run is synchronous, so they are the engine's: the fidelity check measures it."""
from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from polar.trl.rollouts import PolarRollouts, RolloutConfig, StepRollouts, polar_reward
from polar.trl.weights import FenceWeightTransfer, engine_versions


@dataclass(frozen=True)
class TrainConfig:
    model: Path  # the served model's directory: the trainer starts from the same weights
    steps: int = 3
    groups_per_step: int = 2
    group_size: int = 4
    learning_rate: float = 3e-2  # high: a random 2-layer model, few samples per step
    max_tokens: int = 16
    seed: int = 0
    overlap: bool = False  # rollouts of step k+1 run while step k trains (RolloutConfig.overlap)


@dataclass
class StepReport:
    step: int
    batch_id: str
    rows: int
    reward_mean: float
    logprob_err: float  # max |trainer - recorded| before this step's update (ratio 1 means 0)
    ratio_mean: float  # exp(new - old) over trained tokens after the update
    ratio_max: float
    row_versions: list[int]  # the policy versions the step's rows carry
    engine_version: str  # what the engine reported after this step's sync
    wait_s: float
    train_s: float
    sync_s: float
    trajectory_ids: list[str] = field(default_factory=list)

    def line(self) -> str:
        return (f"step {self.step:3d}  reward {self.reward_mean:.3f}  logprob err {self.logprob_err:.1e}  "
                f"ratio mean {self.ratio_mean:.3f} max {self.ratio_max:.3f}  rows v{self.row_versions} -> engine "
                f"v{self.engine_version}  rollout {self.wait_s:.1f}s train {self.train_s:.1f}s "
                f"sync {self.sync_s:.2f}s")


def ratio_stats(model: Any, step: StepRollouts) -> tuple[float, float]:
    """Mean and max of exp(new - old) over the trained tokens of the usable rows."""
    import torch

    from polar.trl.logprobs import recompute

    ratios = []
    for row in step.usable:
        if row.response_ids:
            mask = torch.tensor(row.loss_mask, dtype=torch.bool)
            ratios.append(torch.exp(recompute(model, row) - torch.tensor(row.old_logprobs))[mask])
    flat = torch.cat(ratios) if ratios else torch.ones(1)
    return float(flat.mean()), float(flat.max())


class PolarLoop:
    """Holds the step being trained between TRL's rollout_func and its step-end callback."""

    def __init__(self, rollouts: PolarRollouts, sync: FenceWeightTransfer,
                 on_step: Callable[[StepReport], None] | None = None) -> None:
        from transformers import TrainerCallback

        self.rollouts, self.sync, self.on_step = rollouts, sync, on_step
        self.reports: list[StepReport] = []
        self._step: StepRollouts | None = None
        self._err = math.nan
        self._t_step = time.monotonic()
        loop = self

        class SyncCallback(TrainerCallback):
            def on_step_end(self, args: Any, state: Any, control: Any, model: Any = None, **kw: Any) -> None:
                loop.step_end(model)

        self.callback = SyncCallback()

    def on_rollouts(self, step: StepRollouts, trainer: Any) -> None:
        from polar.trl.logprobs import max_abs_error

        self._step = step
        self._err = max_abs_error(trainer.model, step.usable)

    def step_end(self, model: Any) -> None:
        assert self._step is not None, "a step ended without rollouts"
        step, t_train_end = self._step, time.monotonic()
        mean, top = ratio_stats(model, step)
        self.rollouts.update_model_version(self.sync.push(model))
        version = engine_versions(self.sync.engines)
        wall = t_train_end - self._t_step
        report = StepReport(len(self.reports), step.batch_id, len(step.rows), step.reward_mean(), self._err, mean,
                            top, sorted(step.versions()), ",".join(sorted(set(version))), step.wait_s,
                            wall - step.wait_s, self.sync.times.total_s, [r.trajectory_id for r in step.rows])
        self.reports.append(report)
        self._t_step = time.monotonic()
        if self.on_step is not None:
            self.on_step(report)


def train(client: Any, engines: list[str], tasks: list[dict[str, Any]], out: Path, config: TrainConfig,
          on_step: Callable[[StepReport], None] | None = None) -> list[StepReport]:
    """Run `config.steps` GRPO steps of GRPOTrainer on Polar's rollouts; returns one report per step."""
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    from datasets import Dataset
    from transformers import AutoTokenizer
    from transformers.trainer_callback import PrinterCallback
    from trl import GRPOConfig, GRPOTrainer

    g, n = config.group_size, config.groups_per_step
    rollouts = PolarRollouts(client, tasks, RolloutConfig(
        group_size=g, out=out / "batches", sampling={"temperature": 1.0, "max_tokens": config.max_tokens},
        overlap=config.overlap))
    served = engine_versions(engines)
    if len(set(served)) != 1 or not served[0].isdigit():
        raise ValueError(f"the engines must serve one numeric weight version to start from, got {served}")
    sync = FenceWeightTransfer(client, engines, config.model, out / "weights", version=int(served[0]))
    sync.init_weight_transfer()
    rollouts.update_model_version(sync.version)
    rollouts.check_health()
    loop = PolarLoop(rollouts, sync, on_step)
    args = GRPOConfig(
        output_dir=str(out / "trainer"), per_device_train_batch_size=n * g, num_generations=g,
        gradient_accumulation_steps=1, max_steps=config.steps, learning_rate=config.learning_rate,
        temperature=1.0, beta=0.0, num_iterations=1, use_cpu=True, bf16=False, report_to=[],
        save_strategy="no", logging_steps=1, disable_tqdm=True, seed=config.seed, shuffle_dataset=False,
        max_completion_length=config.max_tokens, lr_scheduler_type="constant", warmup_steps=0)
    trainer = GRPOTrainer(
        model=str(config.model), reward_funcs=polar_reward, args=args,
        train_dataset=Dataset.from_dict({"prompt": [t["task_id"] for t in tasks]}),
        processing_class=AutoTokenizer.from_pretrained(str(config.model)),
        rollout_func=rollouts.trl_rollout_func(loop.on_rollouts), callbacks=[loop.callback])
    trainer.remove_callback(PrinterCallback)  # its dict per step; StepReport.line() says what matters here
    try:
        trainer.train()
    finally:
        rollouts.stop()
    return loop.reports


def summarize(reports: list[StepReport], window: int = 5) -> dict[str, float]:
    """Reward mean over the first and last `window` steps, fidelity, and where a step's time goes."""
    k = min(window, len(reports))

    def mean(values: list[float]) -> float:
        return sum(values) / len(values) if values else math.nan

    step_s = [r.wait_s + r.train_s + r.sync_s for r in reports]
    return {"steps": len(reports), "window": k,
            "reward_first": mean([r.reward_mean for r in reports[:k]]),
            "reward_last": mean([r.reward_mean for r in reports[-k:]]),
            "logprob_err_step0": reports[0].logprob_err if reports else math.nan,
            "logprob_err_max": max((r.logprob_err for r in reports), default=math.nan),
            "rollout_s": mean([r.wait_s for r in reports]), "train_s": mean([r.train_s for r in reports]),
            "sync_s": mean([r.sync_s for r in reports]), "step_s": mean(step_s),
            "wait_fraction": sum(r.wait_s for r in reports) / sum(step_s) if reports else math.nan,
            "samples_per_s": sum(r.rows for r in reports) / sum(r.wait_s for r in reports) if reports else math.nan}


def summary_line(s: dict[str, float]) -> str:
    return (f"reward mean, first {s['window']} steps {s['reward_first']:.3f} -> last {s['window']} steps "
            f"{s['reward_last']:.3f}; logprob err at step 0 {s['logprob_err_step0']:.1e} (max over steps "
            f"{s['logprob_err_max']:.1e}); per step {s['step_s']:.1f}s: rollout {s['rollout_s']:.1f}s, train "
            f"{s['train_s']:.2f}s, weight sync {s['sync_s']:.2f}s (trainer waiting {100 * s['wait_fraction']:.0f}% "
            f"of the time); rollouts {s['samples_per_s']:.1f} samples/s")
