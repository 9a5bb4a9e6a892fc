"""schema.py: the one declared table, equal to docs/design.md §4, with its version."""
from __future__ import annotations

import pyarrow as pa
import pytest

from polar_traj.schema import SCHEMA_VERSION, TRAJECTORY_SCHEMA, VERSION_KEY, check_version

DESIGN_COLUMNS = {
    "trajectory_id": "string", "task_id": "string", "session_id": "string", "group_id": "string",
    "strategy": "string", "status": "string", "prompt_ids": "list<item: int32>",
    "response_ids": "list<item: int32>", "loss_mask": "list<item: int8>", "logprobs": "list<item: float>",
    "call_ids": "list<item: string>", "num_calls": "int32", "prompt_len": "int32", "response_len": "int32",
    "policy_version_min": "int64", "policy_version_max": "int64", "reward": "double", "advantage": "double",
    "weight": "float", "metadata": "string",
}


def test_schema_is_design_section_4_with_its_version():
    assert {f.name: str(f.type) for f in TRAJECTORY_SCHEMA} == DESIGN_COLUMNS
    assert list(TRAJECTORY_SCHEMA.names) == list(DESIGN_COLUMNS)
    assert TRAJECTORY_SCHEMA.metadata[VERSION_KEY] == SCHEMA_VERSION.encode()


def test_check_version():
    check_version(TRAJECTORY_SCHEMA, "here")
    with pytest.raises(ValueError, match="not a polar_traj trajectory file"):
        check_version(pa.schema([("x", pa.int32())]), "here")
    with pytest.raises(ValueError, match="schema version 0"):
        check_version(TRAJECTORY_SCHEMA.with_metadata({VERSION_KEY: b"0"}), "here")
