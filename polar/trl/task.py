"""Tasks the tiny random model (fixtures/tiny-qwen2) can learn on a CPU in minutes. `vowels`: ask for an answer,
score the fraction of its characters that are vowels, over at least TARGET_CHARS characters; dense (every token
moves it a little) and low at first (~0.25 for the untrained model), so a trainer can be seen to climb it.
`brevity`: 1 - characters / BREVITY_CHARS (0 for no answer), so the model must learn to end its turn early (one
token, where the vowel task moves the whole distribution). The harness is one curl call (one-call.yaml); the
scorers read the reply it saved."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from polar.sandbox.agent_files import AgentFileError, read_beneath

ADAPTER = Path(__file__).with_name("one-call.yaml")
VOWELS = frozenset("aeiou")
TARGET_CHARS = 16  # a shorter answer is scored over this many characters: stopping early does not pay
PROMPTS = ("Sing a long vowel song.", "Say aaa and ooo.", "Answer with vowels only.", "Hum a tune, eee.")


BREVITY_CHARS = 64


def brevity_reward(text: str) -> float:
    """1 for an empty answer, 0 at BREVITY_CHARS characters or more."""
    return max(0.0, 1.0 - len(text) / BREVITY_CHARS)


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


def _answer(workspace: Path) -> str:
    """The saved reply's text; a missing or broken answer.json is the agent's failure: ''."""
    try:
        return answer_text(read_beneath(workspace, "answer.json"))
    except AgentFileError:
        return ""


def score(workspace: Path, summary: dict[str, Any]) -> dict[str, Any]:
    """The vowel task's `python` evaluator."""
    text = _answer(workspace)
    return {"reward": vowel_reward(text), "output": json.dumps({"answer": text})}


def score_brevity(workspace: Path, summary: dict[str, Any]) -> dict[str, Any]:
    """The brevity task's `python` evaluator: no answer (missing, broken or empty) is 0, so the best is short."""
    text = _answer(workspace)
    return {"reward": brevity_reward(text) if text else 0.0, "output": json.dumps({"answer": text})}


SCORERS = {"vowels": "polar.trl.task:score", "brevity": "polar.trl.task:score_brevity"}


def write_tasks(path: Path, n_tasks: int, timeout_s: int = 60, kind: str = "vowels") -> Path:
    """A tasks file of `n_tasks` tasks of `kind` (vowels or brevity; prompts cycled), harness one-call.yaml, scored
    in the verify sandbox (this module imports only the standard library and Polar's own agent_files.py at its top:
    an evaluator starts in ~10 ms, where verify.py's sandbox imports took ~85)."""
    import yaml

    tasks = [{"task_id": f"{kind}-{i}", "instruction": PROMPTS[i % len(PROMPTS)], "adapter": str(ADAPTER),
              "image": "host", "timeout_s": timeout_s, "submit": ["answer.json"],
              "evaluator": {"python": SCORERS[kind], "timeout_s": 60}} for i in range(n_tasks)]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump({"tasks": tasks}, sort_keys=False))
    return path
