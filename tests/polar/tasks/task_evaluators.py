"""Python evaluators for the task tests (`python: tests.polar.tasks.task_evaluators:NAME`)."""
from __future__ import annotations

from pathlib import Path
from typing import Any


def half(workspace: Path, summary: dict[str, Any]) -> dict[str, Any]:
    """0.5, and what it saw, so the test can check the arguments arrived."""
    return {"reward": 0.5, "output": f"{sorted(p.name for p in workspace.iterdir())} {summary['task_id']}"}


def crash(workspace: Path, summary: dict[str, Any]) -> float:
    raise RuntimeError("the verifier itself is broken")


def no_number(workspace: Path, summary: dict[str, Any]) -> str:
    return "yes"
