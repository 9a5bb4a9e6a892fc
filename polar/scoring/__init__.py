"""Scoring: how a finished sample earns its reward: the verify ground, the allowlist, the evaluators, Polar's observer
and its runner, the suspicious-change scan, the precheck and the oracle. Imports the task's plain values
(polar/tasks/task.py), never the task-file parsers."""
