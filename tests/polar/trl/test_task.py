"""polar.trl.task: the vowel reward and the scorer's reading of the saved reply."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from polar.tasks.load import load_tasks
from polar.trl.task import BREVITY_CHARS, TARGET_CHARS, score, score_brevity, vowel_reward, write_tasks


def test_vowel_reward_is_dense_and_bounded():
    assert vowel_reward("") == 0.0
    assert vowel_reward("a" * TARGET_CHARS) == 1.0
    assert vowel_reward("a") == pytest.approx(1 / TARGET_CHARS)  # stopping early does not pay
    assert vowel_reward("ab" * TARGET_CHARS) == pytest.approx(0.5)


def test_score_reads_answer_json(tmp_path: Path):
    reply = {"choices": [{"message": {"role": "assistant", "content": "aeiou" * 4}}]}
    (tmp_path / "answer.json").write_text(json.dumps(reply))
    assert score(tmp_path, {})["reward"] == 1.0
    (tmp_path / "answer.json").write_text("not json")
    assert score(tmp_path, {})["reward"] == 0.0
    (tmp_path / "answer.json").unlink()
    (tmp_path / "answer.json").symlink_to("/etc/hostname")  # never followed: the agent's failure
    assert score(tmp_path, {})["reward"] == 0.0


def test_brevity_pays_for_a_short_answer_not_for_none(tmp_path: Path):
    for text, reward in (("ab", 1 - 2 / BREVITY_CHARS), ("x" * BREVITY_CHARS * 2, 0.0), ("", 0.0)):
        reply = {"choices": [{"message": {"role": "assistant", "content": text}}]}
        (tmp_path / "answer.json").write_text(json.dumps(reply))
        assert score_brevity(tmp_path, {})["reward"] == pytest.approx(reward)
    (tmp_path / "answer.json").unlink()
    assert score_brevity(tmp_path, {})["reward"] == 0.0


def test_tasks_file_loads(tmp_path: Path):
    specs = load_tasks(write_tasks(tmp_path / "tasks.yaml", 3))
    assert [s.task_id for s in specs] == ["vowels-0", "vowels-1", "vowels-2"]
    assert yaml.safe_load((tmp_path / "tasks.yaml").read_text())["tasks"][0]["evaluator"]["python"]
    brief = load_tasks(write_tasks(tmp_path / "brief.yaml", 1, kind="brevity"))
    assert brief[0].task_id == "brevity-0" and brief[0].evaluator.python == "polar.trl.task:score_brevity"
