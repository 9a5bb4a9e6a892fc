"""Polar as a trainer's rollout worker (TRL): rollouts.py (groups in, trainer rows out), weights.py (weight sync
through the fence), grpo.py (a GRPOTrainer run), task.py (a task the tiny model can learn). Needs the `trl`
extra: pip install '.[serve,trl]'."""
