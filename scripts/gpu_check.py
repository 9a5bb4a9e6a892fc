"""The RL loop with TRL's AsyncGRPOTrainer on a GPU (its tree packing needs the flash-attn3 kernel, so it cannot
run on the CPU suite): Polar's rollouts of the vowel task (polar/trl/task.py) through PolarRolloutWorker, the
weights to the reference server through the fence (FenceWeightTransfer implements TRL's weight-transfer protocol),
a few steps, one line each: the trainer's step, the rows' versions, the masked calls, the reward. Run by
scripts/gpu_check.sh; not part of `make test`.

    python scripts/gpu_check.py --model DIR [--steps 5] [--groups 2] [--group-size 4] [--out DIR]
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, default=ROOT / "fixtures" / "tiny-qwen2")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--groups", type=int, default=2)
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--max-staleness", type=int, default=1)
    p.add_argument("--out", type=Path, default=Path("runs") / f"gpu-check-{time.strftime('%Y%m%d-%H%M%S')}")
    args = p.parse_args()

    import torch
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from trl.experimental.async_grpo import AsyncGRPOConfig, AsyncGRPOTrainer

    from polar.trl.async_worker import PolarRolloutWorker
    from polar import PolarClient
    from polar.trl.local import local_cluster
    from polar.trl.rollouts import PolarRollouts, RolloutConfig, polar_reward
    from polar.trl.task import write_tasks
    from polar.trl.weights import FenceWeightTransfer, engine_versions

    if not torch.cuda.is_available():
        print("gpu_check: no CUDA device: AsyncGRPOTrainer needs one", file=sys.stderr)
        return 2
    tasks = write_tasks(args.out / "tasks.yaml", args.groups)
    with local_cluster(args.out / "services", args.model) as c:
        client = PolarClient(c.broker, c.sessions)
        rollouts = PolarRollouts(client, tasks, RolloutConfig(
            group_size=args.group_size, out=args.out / "batches", max_staleness=args.max_staleness))
        worker = PolarRolloutWorker(rollouts, args.groups, queue_maxsize=4 * args.groups * args.group_size)
        sync = FenceWeightTransfer(client, [c.engine], args.model, args.out / "weights",
                                   version=int(engine_versions([c.engine])[0]))
        t0 = time.monotonic()

        class StepLine(TrainerCallback):
            def on_step_end(self, _args, state, _control, **_kw):
                print(f"step {state.global_step:3d}  engine v{','.join(engine_versions([c.engine]))}  trainer "
                      f"v{rollouts.model_version}  sync {sync.times.total_s:.2f}s  wall {time.monotonic() - t0:.0f}s",
                      flush=True)

            def on_log(self, _args, _state, _control, logs=None, **_kw):
                keep = {k: v for k, v in (logs or {}).items() if "reward" in k or "polar/" in k or "ratio" in k}
                if keep:
                    print("  " + "  ".join(f"{k} {v:.4g}" for k, v in sorted(keep.items())), flush=True)

        config = AsyncGRPOConfig(
            output_dir=str(args.out / "trainer"), num_generations=args.group_size, max_steps=args.steps,
            per_device_train_batch_size=args.groups * args.group_size, learning_rate=3e-2, logging_steps=1,
            max_completion_length=16, max_staleness=args.max_staleness, weight_sync_steps=1, report_to=[],
            save_strategy="no", bf16=False)
        trainer = AsyncGRPOTrainer(
            model=str(args.model), reward_funcs=polar_reward, args=config,
            train_dataset=Dataset.from_dict({"prompt": rollouts.task_ids}),
            processing_class=AutoTokenizer.from_pretrained(str(args.model)), callbacks=[StepLine()],
            rollout_worker=worker, weight_transfer=sync)
        try:
            trainer.train()
        finally:
            worker.stop()
    print(f"gpu_check: {args.steps} steps of AsyncGRPOTrainer on Polar's rollouts, out {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
