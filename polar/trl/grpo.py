"""A GRPO run with TRL's `GRPOTrainer` fed by Polar: each step's rollouts come from the rollout service
(`rollout_func`), each optimizer step's weights reach the engine through the fence (a callback running
FenceWeightTransfer.push), and every step is checked and reported: the trainer's logprobs of the recorded tokens
before its update (on rows sampled at the trainer's own version they must equal the engine's), the importance
ratio against the recorded logprobs and how much of it the cap truncated, the rows per version lag and the calls
masked as too stale, the ratio after the update, rollout wait, train and sync time.

The recorded logprobs are the old policy: GRPOTrainer without vLLM would take its own detached logprobs as the
old ones (ratio 1 even on stale rows), so each trained token's advantage is weighed by the truncated importance
ratio min(exp(trainer - recorded), cap) (correction.py; CorrectedGRPOTrainer). Synchronous rows get weight 1.

TRL 1.16's seams: `GRPOTrainer(rollout_func=…)` runs on a CPU; `trl.experimental.async_grpo.AsyncGRPOTrainer`
(rollout_worker=, weight_transfer=) needs the flash-attn3 kernel for its tree packing, so a GPU
(scripts/gpu_check.sh). FenceWeightTransfer implements that trainer's weight-transfer protocol too."""
from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from polar.trl.correction import DEFAULT_CAP, CorrectionStats, tis_weights
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
    max_staleness: int | None = None  # calls more than this many versions old are not trained (None: any age)
    tis_cap: float = DEFAULT_CAP  # importance weights above this are truncated to it
    correction: bool = True  # False: GRPOTrainer as TRL ships it (old logprobs = its own; for comparison only)


@dataclass
class StepReport:
    step: int
    batch_id: str
    rows: int
    reward_mean: float
    logprob_err: float  # max |trainer - recorded| before this step's update, over rows of lag 0 (NaN: none)
    ratio_mean: float  # exp(new - recorded) over trained tokens after the update
    ratio_max: float
    row_versions: list[int]  # the policy versions the step's rows carry
    is_mean: float  # importance ratio exp(trainer - recorded) before the update, over trained tokens
    is_max: float
    is_capped: float  # fraction of trained tokens whose ratio was above the cap (weighed at the cap)
    rows_per_lag: dict[int, int]  # trained rows by versions between their oldest call and the trainer
    masked_calls: int  # calls older than max_staleness: their tokens not trained
    stale_rows: int  # rows with no call young enough: not trained at all
    engine_version: str  # what the engine reported after this step's sync
    wait_s: float
    train_s: float
    sync_s: float
    trajectory_ids: list[str] = field(default_factory=list)
    groups_with_signal: int = 0  # groups whose rewards differ (StepRollouts.signal): the others teach nothing
    groups: int = 0

    def line(self) -> str:
        lags = ",".join(f"{k}:{v}" for k, v in sorted(self.rows_per_lag.items()))
        return (f"step {self.step:3d}  reward {self.reward_mean:.3f}  logprob err {self.logprob_err:.1e}  "
                f"IS ratio mean {self.is_mean:.3f} max {self.is_max:.2f} capped {100 * self.is_capped:.1f}%  "
                f"rows by lag {{{lags}}} masked calls {self.masked_calls}, stale rows {self.stale_rows}  "
                f"after update mean {self.ratio_mean:.3f} max {self.ratio_max:.2f}  "
                f"rows v{self.row_versions} -> engine v{self.engine_version}  "
                f"rollout {self.wait_s:.1f}s train {self.train_s:.1f}s sync {self.sync_s:.2f}s")


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


def corrected_trainer() -> type:
    """GRPOTrainer whose per-token advantages are weighed by `polar_token_weights` (set by the rollout step, one
    list per completion in order, used once). A weight w >= 0 on the advantage is the same as on the token's
    loss for TRL's clipped losses (grpo, bnpo, dr_grpo, dapo, cispo: -min(r A w, clip(r) A w) = w (-min(r A,
    clip(r) A))), and TRL's loss takes advantages of shape (B, T) for exactly this kind of subclass."""
    import torch
    from trl import GRPOTrainer

    class CorrectedGRPOTrainer(GRPOTrainer):
        polar_token_weights: list[list[float]] | None = None

        def _generate_and_score_completions(self, inputs: Any) -> dict[str, Any]:
            out = super()._generate_and_score_completions(inputs)
            weights, self.polar_token_weights = self.polar_token_weights, None
            if weights is None or len(weights) != out["completion_ids"].shape[0]:
                raise RuntimeError("no importance weights for this batch's completions (the rollout step sets them)")
            w = torch.zeros(out["completion_ids"].shape, dtype=out["advantages"].dtype)
            for i, row in enumerate(weights):
                n = min(len(row), w.shape[1])
                w[i, :n] = torch.tensor(row[:n])
            out["advantages"] = out["advantages"].reshape(-1, 1) * w.to(out["advantages"].device)
            return out

    return CorrectedGRPOTrainer


class PolarLoop:
    """Holds the step being trained between TRL's rollout_func and its step-end callback."""

    def __init__(self, rollouts: PolarRollouts, sync: FenceWeightTransfer,
                 on_step: Callable[[StepReport], None] | None = None, tis_cap: float = DEFAULT_CAP,
                 correction: bool = True) -> None:
        from transformers import TrainerCallback

        self.rollouts, self.sync, self.on_step = rollouts, sync, on_step
        self.tis_cap, self.correction = tis_cap, correction
        self.reports: list[StepReport] = []
        self._step: StepRollouts | None = None
        self._err = math.nan
        self._stats = CorrectionStats(tis_cap)
        self._t_step = time.monotonic()
        loop = self

        class SyncCallback(TrainerCallback):
            def on_step_end(self, args: Any, state: Any, control: Any, model: Any = None, **kw: Any) -> None:
                loop.step_end(model)

        self.callback = SyncCallback()

    def on_rollouts(self, step: StepRollouts, trainer: Any) -> None:
        """The trainer's logprobs of every trained token before its update: the fidelity check on rows of lag 0,
        the importance weights of all rows (handed to the trainer), and the step's ratio statistics."""
        import torch

        from polar.trl.logprobs import recompute

        self._step, self._stats, err = step, CorrectionStats(self.tis_cap, masked_calls=step.masked_calls), None
        weights: list[list[float]] = []
        for row in step.rows:
            if not row.usable:
                weights.append([0.0] * max(1, len(row.response_ids)))
                self._stats.stale_rows += row.stale
                continue
            mask = torch.tensor(row.loss_mask, dtype=torch.float32)
            trainer_lp, recorded = recompute(trainer.model, row), torch.tensor(row.old_logprobs)
            lag = step.lag(row)
            key = -1 if lag is None else lag  # -1: the engine reported no version
            self._stats.rows_per_lag[key] = self._stats.rows_per_lag.get(key, 0) + 1
            if not lag and mask.any():  # sampled at the trainer's own version: must agree with the engine
                err = max(err or 0.0, float(((trainer_lp - recorded) * mask).abs().max()))
            w, ratio = tis_weights(trainer_lp, recorded, mask, self.tis_cap)
            self._stats.add(ratio[mask.bool()])
            weights.append(w.tolist())
        self._err = math.nan if err is None else err
        if self.correction:
            trainer.polar_token_weights = weights

    def step_end(self, model: Any) -> None:
        assert self._step is not None, "a step ended without rollouts"
        step, t_train_end = self._step, time.monotonic()
        mean, top = ratio_stats(model, step)
        self.rollouts.update_model_version(self.sync.push(model))
        version = engine_versions(self.sync.engines)
        wall = t_train_end - self._t_step
        tis = self._stats.summary()
        report = StepReport(len(self.reports), step.batch_id, len(step.rows), step.reward_mean(), self._err, mean,
                            top, sorted(step.versions()), tis["ratio_mean"], tis["ratio_max"],
                            tis["capped_fraction"], dict(sorted(self._stats.rows_per_lag.items())),
                            self._stats.masked_calls, self._stats.stale_rows, ",".join(sorted(set(version))),
                            step.wait_s, wall - step.wait_s, self.sync.times.total_s,
                            [r.trajectory_id for r in step.rows], *step.signal())
        self.reports.append(report)
        self._t_step = time.monotonic()
        if self.on_step is not None:
            self.on_step(report)


def train(client: Any, engines: list[str], tasks: Path, out: Path, config: TrainConfig,
          on_step: Callable[[StepReport], None] | None = None, adapter: str | None = None) -> list[StepReport]:
    """Run `config.steps` GRPO steps of GRPOTrainer on Polar's rollouts of `tasks` (a tasks file or a Harbor
    folder: `config.groups_per_step` of its tasks a step, in order, cycling); returns one report per step."""
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    from datasets import Dataset
    from transformers import AutoTokenizer
    from transformers.trainer_callback import PrinterCallback
    from trl import GRPOConfig, GRPOTrainer

    g, n = config.group_size, config.groups_per_step
    rollouts = PolarRollouts(client, tasks, RolloutConfig(
        group_size=g, out=out / "batches", sampling={"temperature": 1.0, "max_tokens": config.max_tokens},
        overlap=config.overlap, max_staleness=config.max_staleness), adapter)
    served = engine_versions(engines)
    if len(set(served)) != 1 or not served[0].isdigit():
        raise ValueError(f"the engines must serve one numeric weight version to start from, got {served}")
    sync = FenceWeightTransfer(client, engines, config.model, out / "weights", version=int(served[0]))
    sync.init_weight_transfer()
    rollouts.update_model_version(sync.version)
    rollouts.check_health()
    loop = PolarLoop(rollouts, sync, on_step, config.tis_cap, config.correction)
    args = GRPOConfig(
        output_dir=str(out / "trainer"), per_device_train_batch_size=n * g, num_generations=g,
        gradient_accumulation_steps=1, max_steps=config.steps, learning_rate=config.learning_rate,
        temperature=1.0, beta=0.0, num_iterations=1, use_cpu=True, bf16=False, report_to=[],
        save_strategy="no", logging_steps=1, disable_tqdm=True, seed=config.seed, shuffle_dataset=False,
        max_completion_length=config.max_tokens, lr_scheduler_type="constant", warmup_steps=0)
    trainer = (corrected_trainer() if config.correction else GRPOTrainer)(
        model=str(config.model), reward_funcs=polar_reward, args=args,
        train_dataset=Dataset.from_dict({"prompt": rollouts.task_ids}),
        processing_class=AutoTokenizer.from_pretrained(str(config.model)),
        rollout_func=rollouts.trl_rollout_func(loop.on_rollouts), callbacks=[loop.callback])
    trainer.remove_callback(PrinterCallback)  # its dict per step; StepReport.line() says what matters here
    try:
        trainer.train()
    finally:
        rollouts.stop()
    return loop.reports


def zero_signal(report: StepReport) -> str | None:
    """The line for a step that taught nothing: every group's rewards equal (GRPO's advantages all zero)."""
    if report.groups and not report.groups_with_signal:
        rewards = f"{report.reward_mean:g}" if report.reward_mean == report.reward_mean else "none"
        return (f"polar train: step {report.step}: no signal: in each of the {report.groups} groups every sample "
                f"scored the same (mean reward {rewards}), so every advantage is 0 and this step learns nothing; "
                "check the task's reward (polar tasks check) or make the task easier or the groups larger")
    return None


def summarize(reports: list[StepReport], window: int = 5) -> dict[str, float]:
    """Reward mean over the first and last `window` steps (fewer in a short run, so the two never share a step),
    fidelity, and where a step's time goes."""
    k = min(window, max(1, len(reports) // 2))

    def mean(values: list[float]) -> float:
        return sum(values) / len(values) if values else math.nan

    step_s = [r.wait_s + r.train_s + r.sync_s for r in reports]
    return {"steps": len(reports), "window": k,
            "reward_first": mean([r.reward_mean for r in reports[:k]]),
            "reward_last": mean([r.reward_mean for r in reports[-k:]]),
            "logprob_err_step0": reports[0].logprob_err if reports else math.nan,
            "logprob_err_max": max((r.logprob_err for r in reports if r.logprob_err == r.logprob_err),
                                   default=math.nan),  # NaN: a step without rows of lag 0
            "rollout_s": mean([r.wait_s for r in reports]), "train_s": mean([r.train_s for r in reports]),
            "sync_s": mean([r.sync_s for r in reports]), "step_s": mean(step_s),
            "wait_fraction": sum(r.wait_s for r in reports) / sum(step_s) if reports else math.nan,
            "is_mean": mean([r.is_mean for r in reports if r.is_mean == r.is_mean]),
            "is_max": max((r.is_max for r in reports if r.is_max == r.is_max), default=math.nan),
            "is_capped": mean([r.is_capped for r in reports]),
            "lag1_rows": sum(n for r in reports for lag, n in r.rows_per_lag.items() if lag >= 1),
            "masked_calls": sum(r.masked_calls for r in reports),
            "samples_per_s": sum(r.rows for r in reports) / sum(r.wait_s for r in reports) if reports else math.nan}


def summary_line(s: dict[str, float]) -> str:
    return (f"reward mean, first {s['window']} steps {s['reward_first']:.3f} -> last {s['window']} steps "
            f"{s['reward_last']:.3f}; logprob err at step 0 {s['logprob_err_step0']:.1e} (max over steps "
            f"{s['logprob_err_max']:.1e}); per step {s['step_s']:.1f}s: rollout {s['rollout_s']:.1f}s, train "
            f"{s['train_s']:.2f}s, weight sync {s['sync_s']:.2f}s (trainer waiting {100 * s['wait_fraction']:.0f}% "
            f"of the time); rollouts {s['samples_per_s']:.1f} samples/s; IS ratio mean {s['is_mean']:.3f} max "
            f"{s['is_max']:.2f}, {100 * s['is_capped']:.1f}% of tokens capped; {s['lag1_rows']} rows a version or "
            f"more behind, {s['masked_calls']} calls masked as stale")
