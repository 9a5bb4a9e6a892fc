"""Python evaluators for the task tests (`python: tests.polar.scoring.task_evaluators:NAME`)."""
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


def seven(workspace: Path, summary: dict[str, Any]) -> float:
    return 7.0


def where(workspace: Path, summary: dict[str, Any]) -> dict[str, Any]:
    """Where it runs: 1.0 only as a user other than root with the workspace off sys.path (json, imported by the
    runner, is the standard library's); and what its pid 1 is (the caller compares it with the host's)."""
    import json
    import os
    import sys

    on_path = any(os.path.realpath(p or ".") == os.path.realpath(workspace) for p in sys.path)
    with open("/proc/1/cmdline", "rb") as f:
        init = f.read().replace(b"\0", b" ").decode(errors="replace")
    ok = os.getuid() != 0 and not on_path and json.__file__.startswith(sys.prefix)
    return {"reward": 1.0 if ok else 0.0,
            "output": f"uid {os.getuid()}; workspace on sys.path: {on_path}; pid 1: {init[:60]}\n"}
