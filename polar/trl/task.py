"""A task the tiny random model (fixtures/tiny-qwen2) can learn on a CPU in minutes: ask for an answer, score
the fraction of its characters that are vowels, over at least TARGET_CHARS characters. The reward is dense
(every token moves it a little) and starts low (~0.15 for the untrained model), so a trainer can be seen to
climb it. The harness is one curl call (one-call.yaml); the scorer reads the reply it saved."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from polar.tasks.verify import AgentFileError, read_beneath

ADAPTER = Path(__file__).with_name("one-call.yaml")
VOWELS = frozenset("aeiou")
TARGET_CHARS = 16  # a shorter answer is scored over this many characters: stopping early does not pay
PROMPTS = ("Sing a long vowel song.", "Say aaa and ooo.", "Answer with vowels only.", "Hum a tune, eee.")


def vowel_reward(text: str) -> float:
    """Vowels over max(len(text), TARGET_CHARS): 0 for no vowels, 1 for at least TARGET_CHARS vowels only."""
    return sum(c in VOWELS for c in text) / max(len(text), TARGET_CHARS)


def answer_text(raw: bytes) -> str:
    """The assistant's text in a Chat Completions reply ('' when there is none)."""
    try:
        body = json.loads(raw)
        return str(body["choices"][0]["message"].get("content") or "")
    except (ValueError, KeyError, IndexError, TypeError, AttributeError):
        return ""


def score(workspace: Path, summary: dict[str, Any]) -> dict[str, Any]:
    """The task's `python` evaluator: a missing or broken answer.json is the agent's failure, reward 0."""
    try:
        text = answer_text(read_beneath(workspace, "answer.json"))
    except AgentFileError:
        text = ""
    return {"reward": vowel_reward(text), "output": json.dumps({"answer": text})}


def write_tasks(path: Path, n_tasks: int, timeout_s: int = 60) -> Path:
    """A tasks file of `n_tasks` vowel tasks (prompts cycled), harness one-call.yaml, scored by score() (in the
    verify sandbox: this module imports only the standard library and Polar's own verify.py at its top)."""
    import yaml

    tasks = [{"task_id": f"vowels-{i}", "instruction": PROMPTS[i % len(PROMPTS)], "adapter": str(ADAPTER),
              "image": "host", "timeout_s": timeout_s, "submit": ["answer.json"],
              "evaluator": {"python": "polar.trl.task:score", "timeout_s": 60}} for i in range(n_tasks)]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump({"tasks": tasks}, sort_keys=False))
    return path
