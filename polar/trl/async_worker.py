"""Polar as the rollout worker of TRL's `AsyncGRPOTrainer` (trl.experimental.async_grpo: a GPU trainer, its
tree packing needs the flash-attn3 kernel; scripts/gpu_check.sh runs it). A thread collects one step's groups at
a time from the rollout service (PolarRollouts, which masks calls older than max_staleness) and puts every
trained row on `rollout_buffer` as TRL's RolloutSample: prompt and response ids as one sequence, the loss mask
as completion mask, the recorded logprobs as the old ones (the trainer's importance ratio is taken against
them), Polar's advantage, and the version of the row's oldest call. The trainer syncs weights through
FenceWeightTransfer and tells this worker the live version (`update_model_version`)."""
from __future__ import annotations

import os
import queue
import threading
import time
from typing import Any

from polar.trl.rollouts import PolarRollouts, Row


def rollout_sample(row: Row, group_id: int) -> Any:
    """One row as TRL's RolloutSample (the prompt side at mask 0 and logprob 0)."""
    import numpy as np

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    from trl.experimental.async_grpo.async_rollout_worker import RolloutSample

    n = len(row.prompt_ids)
    return RolloutSample(
        prompt=[], completion=[], input_ids=np.array(row.prompt_ids + row.response_ids, dtype=np.int64),
        completion_mask=np.array([0] * n + row.loss_mask, dtype=np.int64),
        old_log_probs=np.array([0.0] * n + row.old_logprobs, dtype=np.float32),
        advantage=float(row.advantage or 0.0), model_version=int(row.policy_version_min or 0), group_id=group_id,
        metrics={"reward": float(row.reward if row.reward is not None else 0.0)}, enqueued_at=time.time())


class PolarRolloutWorker:
    """TRL's RolloutWorkerProtocol over PolarRollouts: `groups_per_step` tasks a batch, cycling through them."""

    def __init__(self, rollouts: PolarRollouts, groups_per_step: int, queue_maxsize: int = 0) -> None:
        self.rollouts, self.groups_per_step = rollouts, groups_per_step
        self.rollout_buffer: queue.Queue = queue.Queue(queue_maxsize)
        self.metrics_queue: queue.Queue = queue.Queue()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._last_put = time.monotonic()
        self._groups = 0

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="polar-rollouts", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self.rollouts.stop()
        if self._thread is not None:
            self._thread.join(timeout=self.rollouts.config.timeout_s)

    def update_model_version(self, model_version: int) -> None:
        self.rollouts.update_model_version(model_version)

    def check_health(self, stale_after_s: float) -> None:
        if self._error is not None:
            raise RuntimeError(f"Polar's rollout worker stopped: {self._error!r}") from self._error
        if self._thread is not None and not self._thread.is_alive() and not self._stop.is_set():
            raise RuntimeError("Polar's rollout worker stopped without an error")
        if stale_after_s and time.monotonic() - self._last_put > stale_after_s:
            raise RuntimeError(f"Polar's rollout worker made no sample in {stale_after_s:.0f}s")

    def next_task_ids(self) -> list[str]:
        ids, k = self.rollouts.task_ids, self.groups_per_step
        start = (self._groups * k) % len(ids)
        return [ids[(start + i) % len(ids)] for i in range(min(k, len(ids)))]

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                step = self.rollouts.collect(self.next_task_ids())
                groups = {t: self._groups * self.groups_per_step + i
                          for i, t in enumerate(dict.fromkeys(r.task_id for r in step.rows))}
                self._groups += 1
                for row in step.usable:
                    self.rollout_buffer.put(rollout_sample(row, groups[row.task_id]))
                    self._last_put = time.monotonic()
                self.metrics_queue.put({"polar/reward_mean": step.reward_mean(),
                                        "polar/masked_calls": float(step.masked_calls),
                                        "polar/rollout_s": step.wait_s})
        except BaseException as e:  # noqa: BLE001 - surfaced by check_health, which the trainer polls
            self._error = e
