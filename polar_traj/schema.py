"""The trajectory table (docs/design.md §4), declared once: the Arrow schema every Parquet part is written with."""
from __future__ import annotations

import pyarrow as pa

# Bump on any change a reader must know about; stored in every file's schema metadata.
SCHEMA_VERSION = "1"
VERSION_KEY = b"polar_traj.schema_version"
STATS_KEY = "polar_traj.stats"  # file key-value metadata: JSON of the batch's merge stats

STRATEGIES = ("per_request", "prefix_merge")
STATUSES = ("completed", "timeout", "error")

_FIELDS = [
    pa.field("trajectory_id", pa.string(), nullable=False),
    pa.field("task_id", pa.string(), nullable=False),
    pa.field("session_id", pa.string(), nullable=False),
    pa.field("group_id", pa.string(), nullable=False),
    pa.field("strategy", pa.string(), nullable=False),
    pa.field("status", pa.string(), nullable=False),
    pa.field("prompt_ids", pa.list_(pa.int32()), nullable=False),
    pa.field("response_ids", pa.list_(pa.int32()), nullable=False),
    pa.field("loss_mask", pa.list_(pa.int8()), nullable=False),
    pa.field("logprobs", pa.list_(pa.float32()), nullable=False),
    pa.field("call_ids", pa.list_(pa.string()), nullable=False),
    pa.field("num_calls", pa.int32(), nullable=False),
    pa.field("prompt_len", pa.int32(), nullable=False),
    pa.field("response_len", pa.int32(), nullable=False),
    pa.field("policy_version_min", pa.int64()),
    pa.field("policy_version_max", pa.int64()),
    pa.field("reward", pa.float64()),
    pa.field("advantage", pa.float64()),
    pa.field("weight", pa.float32(), nullable=False),
    pa.field("metadata", pa.string(), nullable=False),  # JSON object
]

TRAJECTORY_SCHEMA = pa.schema(_FIELDS, metadata={VERSION_KEY: SCHEMA_VERSION.encode()})
COLUMNS = tuple(TRAJECTORY_SCHEMA.names)
TOKEN_COLUMNS = ("prompt_ids", "response_ids", "loss_mask", "logprobs")


def check_version(schema: pa.Schema, where: str) -> None:
    """Refuse files written by another schema version (or by something else entirely)."""
    found = (schema.metadata or {}).get(VERSION_KEY)
    if found is None:
        raise ValueError(f"{where}: not a polar_traj trajectory file (no {VERSION_KEY.decode()} in its metadata)")
    if found.decode() != SCHEMA_VERSION:
        raise ValueError(f"{where}: schema version {found.decode()}, this polar_traj reads {SCHEMA_VERSION}")
