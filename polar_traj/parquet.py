"""Parquet parts of the trajectory table: written whole or not at all, read back as one Table.

`TrajectoryWriter` buffers rows into record batches and writes them to a hidden temporary name in the
target directory; on a clean exit it adds the batch metadata, fsyncs and renames the file into place.
On an exception the temporary file is removed: readers never see a half-written part. A directory of
parts reads as one table (names starting with "." or "_" are ignored, as pyarrow does).
"""
from __future__ import annotations

import json
import os
import time
import uuid
from collections import deque
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from . import atomic
from .schema import STATS_KEY, TOKEN_COLUMNS, TRAJECTORY_SCHEMA, check_version

_NUMPY = {pa.int32(): np.int32, pa.int8(): np.int8, pa.float32(): np.float32}
RECENT_ROWS = 4  # earlier rows of a batch that a row's tokens are checked to start with
MIN_SHARED = 64  # shorter rows are converted whole: a shared prefix would save little
# Token columns are written without dictionary encoding: ids hardly repeat within a page, and plain
# pages let zstd find the long runs that per_request rows share (about half the file, twice as fast).
# Every other column keeps it (a list column is named by its leaf path).
DICTIONARY_COLUMNS = [f"{f.name}.list.element" if pa.types.is_list(f.type) else f.name
                      for f in TRAJECTORY_SCHEMA if f.name not in TOKEN_COLUMNS]


def part_path(directory: str | os.PathLike) -> Path:
    """A fresh part name inside a dataset directory (sortable by time)."""
    return Path(directory) / f"part-{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:12]}.parquet"


def rows_to_batch(rows: list[dict[str, Any]]) -> pa.RecordBatch:
    """Rows (dicts with every column) as one record batch; token columns go through numpy."""
    arrays = []
    for f in TRAJECTORY_SCHEMA:
        values = [row[f.name] for row in rows]
        if f.name in TOKEN_COLUMNS:
            arrays.append(_list_array(values, f.type.value_type))
        else:
            arrays.append(pa.array(values, type=f.type))
    return pa.RecordBatch.from_arrays(arrays, schema=TRAJECTORY_SCHEMA)


def _list_array(values: list[Any], value_type: pa.DataType) -> pa.Array:
    dtype = _NUMPY[value_type]
    offsets = np.zeros(len(values) + 1, dtype=np.int64)
    np.cumsum([len(v) for v in values], out=offsets[1:])
    if offsets[-1] > np.iinfo(np.int32).max:
        raise ValueError("a record batch holds over 2**31 tokens in one column: write fewer rows per batch")
    if not values:
        flat = np.zeros(0, dtype)
    elif np.issubdtype(dtype, np.integer):
        flat = np.concatenate(_int_arrays(values, dtype))
    else:  # floats: 0.0 == -0.0, so an equal prefix may not be the same values
        flat = np.concatenate([np.asarray(v, dtype=dtype) for v in values])
    return pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), pa.array(flat, type=value_type))


def _int_arrays(values: list[Any], dtype: type) -> list[np.ndarray]:
    """Each row as an array. A row whose list starts with a recent row's whole list (per_request: a turn's
    prompt starts with the turn before's) converts only its own tail: converting Python ints is the cost
    here, comparing two lists that mostly hold the same int objects is several times cheaper."""
    recent: deque[tuple[list[int], np.ndarray]] = deque(maxlen=RECENT_ROWS)
    arrays = []
    for v in values:
        array = None
        if type(v) is list:
            for old, old_array in recent:
                n = len(old)
                if n <= len(v) and v[n - 1] == old[-1] and v[0] == old[0] and v[:n] == old:
                    array = np.concatenate([old_array, np.asarray(v[n:], dtype=dtype)])
                    break
        if array is None:
            array = np.asarray(v, dtype=dtype)
        if type(v) is list and len(v) >= MIN_SHARED:
            recent.appendleft((v, array))
        arrays.append(array)
    return arrays


class TrajectoryWriter:
    """with TrajectoryWriter(path) as w: w.write(row) ... ; the file appears only when the block ends cleanly."""

    def __init__(self, path: str | os.PathLike, rows_per_batch: int = 256, max_batch_tokens: int = 1_000_000,
                 compression: str = "zstd") -> None:
        self.path = Path(path)
        self.rows_per_batch, self.max_batch_tokens, self.compression = rows_per_batch, max_batch_tokens, compression
        self.rows_written = 0
        self._rows: list[dict[str, Any]] = []
        self._tokens = 0
        self._metadata: dict[str, str] = {}
        self._writer: pq.ParquetWriter | None = None
        self._tmp: Path | None = None

    def __enter__(self) -> "TrajectoryWriter":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._tmp = atomic.temp_beside(self.path)
        self._writer = pq.ParquetWriter(self._tmp, TRAJECTORY_SCHEMA, compression=self.compression,
                                        use_dictionary=DICTIONARY_COLUMNS)
        return self

    def write(self, row: dict[str, Any]) -> None:
        if self._writer is None:
            raise RuntimeError("TrajectoryWriter used outside its with-block")
        self._rows.append(row)
        self._tokens += len(row["prompt_ids"]) + len(row["response_ids"])
        if len(self._rows) >= self.rows_per_batch or self._tokens >= self.max_batch_tokens:
            self.flush()

    def write_all(self, rows: Iterable[dict[str, Any]]) -> None:
        for row in rows:
            self.write(row)

    def flush(self) -> None:
        if self._rows and self._writer is not None:
            self._writer.write_batch(rows_to_batch(self._rows))
            self.rows_written += len(self._rows)
            self._rows, self._tokens = [], 0

    def set_metadata(self, key: str, value: str) -> None:
        """A key-value pair for the file footer (e.g. the batch's merge stats)."""
        self._metadata[key] = value

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        assert self._writer is not None and self._tmp is not None
        try:
            if exc_type is None:
                self.flush()
                if self._metadata:
                    self._writer.add_key_value_metadata(self._metadata)
            self._writer.close()
            if exc_type is None:
                with open(self._tmp, "rb") as f:
                    os.fsync(f.fileno())
                os.replace(self._tmp, self.path)
        finally:
            self._writer = None
            if self._tmp.exists():
                self._tmp.unlink()


def part_files(path: str | os.PathLike) -> list[Path]:
    p = Path(path)
    if p.is_dir():
        return sorted(f for f in p.glob("*.parquet") if not f.name.startswith((".", "_")))
    if not p.exists():
        raise FileNotFoundError(f"no trajectory file or directory at {p}")
    return [p]


def read(path: str | os.PathLike, columns: list[str] | None = None) -> pa.Table:
    """The trajectory table of one file or of a directory of parts, checked against SCHEMA_VERSION."""
    tables = []
    for f in part_files(path):
        check_version(pq.read_schema(f), str(f))
        tables.append(pq.read_table(f, columns=columns))
    if not tables:
        schema = TRAJECTORY_SCHEMA if columns is None else pa.schema([TRAJECTORY_SCHEMA.field(c) for c in columns])
        return schema.empty_table()
    return pa.concat_tables(tables)


def read_stats(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The merge stats stored in each part's footer (parts written by other tools may have none)."""
    found = []
    for f in part_files(path):
        raw = (pq.read_metadata(f).metadata or {}).get(STATS_KEY.encode())
        if raw:
            found.append(json.loads(raw))
    return found
