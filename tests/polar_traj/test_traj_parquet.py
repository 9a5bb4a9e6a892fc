"""schema.py + parquet.py: the one declared schema, atomic parts, and files others read without Polar."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import polar_traj
from polar_traj.build import BuildConfig
from polar_traj.parquet import TrajectoryWriter, part_files, read, read_stats, rows_to_batch
from polar_traj.pipeline import Selection, build_parquet
from polar_traj.schema import SCHEMA_VERSION, STATS_KEY, TRAJECTORY_SCHEMA, VERSION_KEY

def row(n: int = 0, **over) -> dict:
    base = {"trajectory_id": f"s/prefix_merge/c{n}", "task_id": "t", "session_id": "s", "group_id": "t",
            "strategy": "prefix_merge", "status": "completed", "prompt_ids": [1, 2, 3], "response_ids": [4, 5, 6],
            "loss_mask": [1, 0, 1], "logprobs": [-0.5, 0.0, -0.25], "call_ids": ["c0", "c1"], "num_calls": 2,
            "prompt_len": 3, "response_len": 3, "policy_version_min": None, "policy_version_max": None,
            "reward": None, "advantage": None, "weight": 1.0, "metadata": "{}"}
    return {**base, **over}


def test_round_trip_is_exact(tmp_path):
    rows = [row(0), row(1, prompt_ids=[2**31 - 1], reward=0.25, advantage=-1.5, policy_version_min=3,
                        policy_version_max=7, weight=0.5)]
    with TrajectoryWriter(tmp_path / "a.parquet", rows_per_batch=1) as w:
        w.write_all(rows)
        w.set_metadata(STATS_KEY, json.dumps({"calls": 4}))
    table = read(tmp_path / "a.parquet")
    assert table.schema.equals(TRAJECTORY_SCHEMA, check_metadata=False)
    assert table.to_pylist() == rows
    assert pq.ParquetFile(tmp_path / "a.parquet").num_row_groups == 2
    assert read_stats(tmp_path / "a.parquet") == [{"calls": 4}]
    assert polar_traj.read(tmp_path / "a.parquet").num_rows == 2


def test_nothing_appears_until_the_writer_finishes(tmp_path):
    target = tmp_path / "out.parquet"
    with pytest.raises(RuntimeError, match="boom"):
        with TrajectoryWriter(target) as w:
            w.write(row())
            w.flush()
            assert not target.exists()
            raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []  # no part, no temporary left behind


def test_directory_of_parts_reads_as_one_table(tmp_path):
    capture_rows = [row(n) for n in range(3)]
    for r in capture_rows:
        with TrajectoryWriter(tmp_path / f"part-{r['trajectory_id'][-1]}.parquet") as w:
            w.write(r)
    (tmp_path / ".part-x.parquet.123.tmp").write_bytes(b"half a file")
    assert [p.name for p in part_files(tmp_path)] == ["part-0.parquet", "part-1.parquet", "part-2.parquet"]
    assert read(tmp_path).column("trajectory_id").to_pylist() == [r["trajectory_id"] for r in capture_rows]


def test_empty_file_and_empty_directory(tmp_path):
    with TrajectoryWriter(tmp_path / "empty.parquet"):
        pass
    assert read(tmp_path / "empty.parquet").num_rows == 0
    (tmp_path / "parts").mkdir()
    assert read(tmp_path / "parts").schema.names == TRAJECTORY_SCHEMA.names


def test_foreign_or_other_version_files_are_refused(tmp_path):
    pq.write_table(pa.table({"x": [1]}), tmp_path / "foreign.parquet")
    with pytest.raises(ValueError, match="not a polar_traj trajectory file"):
        read(tmp_path / "foreign.parquet")
    other = TRAJECTORY_SCHEMA.with_metadata({VERSION_KEY: b"999"})
    pq.write_table(pa.Table.from_batches([rows_to_batch([row()])]).cast(other), tmp_path / "v999.parquet")
    with pytest.raises(ValueError, match="schema version 999"):
        read(tmp_path / "v999.parquet")


def test_build_into_a_directory_adds_a_part(capture, write_records, chain_session, tmp_path):
    write_records(capture, chain_session(3))
    out = tmp_path / "dataset"
    out.mkdir()
    first = build_parquet(Selection(capture), out)
    second = build_parquet(Selection(capture), out, BuildConfig(strategy="per_request"))
    assert first.path.parent == out and first.path != second.path
    assert read(out).num_rows == 1 + 3
    fresh = build_parquet(Selection(capture), f"{tmp_path}/new-dataset/")  # a trailing slash: a directory
    assert fresh.path.parent == tmp_path / "new-dataset" and read(fresh.path.parent).num_rows == 1


READER = textwrap.dedent("""
    import json, sys
    import pandas as pd
    import pyarrow.parquet as pq
    table = pq.read_table(sys.argv[1])
    df = pd.read_parquet(sys.argv[1])
    assert not any(m.split(".")[0].startswith("polar") for m in sys.modules), "polar was imported"
    print(json.dumps({
        "rows": table.num_rows, "columns": table.column_names,
        "response_ids": [list(map(int, x)) for x in df["response_ids"]],
        "loss_mask": [list(map(int, x)) for x in df["loss_mask"]],
        "logprobs": [list(map(float, x)) for x in df["logprobs"]],
        "reward": [None if pd.isna(x) else float(x) for x in df["reward"]],
        "version": table.schema.metadata[b"polar_traj.schema_version"].decode(),
        "meta": json.loads(df["metadata"][0])["chain_start"]["kind"],
    }))
""")


def test_pyarrow_and_pandas_read_it_without_polar(capture, write_records, chain_session, tmp_path):
    calls = chain_session(3)
    write_records(capture, calls)
    out = tmp_path / "out.parquet"
    build_parquet(Selection(capture), out)
    script = tmp_path / "reader.py"
    script.write_text(READER)
    done = subprocess.run([sys.executable, "-I", str(script), str(out)], capture_output=True, text=True,
                          cwd=tmp_path, check=True)
    got = json.loads(done.stdout)
    expected = read(out).to_pylist()[0]
    assert got["rows"] == 1 and got["columns"] == TRAJECTORY_SCHEMA.names and got["version"] == SCHEMA_VERSION
    assert got["response_ids"] == [expected["response_ids"]] and got["loss_mask"] == [expected["loss_mask"]]
    assert got["logprobs"] == [expected["logprobs"]] and got["reward"] == [None] and got["meta"] == "new"


def test_rows_sharing_a_prefix_convert_exactly():
    """A row that starts with a recent row's whole list reuses its converted ids; every other shape (a
    shorter row, a tuple, an array, a row that differs at the end, another row in between) converts whole."""
    import numpy as np

    base = list(range(3, 203))
    prompts = [base, base + [7, 8], [1] + base, base[:-1] + [9], tuple(base + [5]), np.array(base + [6]),
               base + [7, 8, 10], base[:50], base + [7, 8, 10, 11], []]
    rows = [row(n, prompt_ids=p, loss_mask=[1] * (n + 64) + [0] * n)
            for n, p in enumerate(prompts)]
    batch = rows_to_batch(rows)
    assert batch.column("prompt_ids").to_pylist() == [list(map(int, p)) for p in prompts]
    assert batch.column("loss_mask").to_pylist() == [r["loss_mask"] for r in rows]


def test_token_columns_are_written_without_a_dictionary(tmp_path):
    with TrajectoryWriter(tmp_path / "a.parquet") as w:
        w.write_all([row(0), row(1)])
    group = pq.ParquetFile(tmp_path / "a.parquet").metadata.row_group(0)
    encodings = {group.column(i).path_in_schema.split(".")[0]: group.column(i).encodings
                 for i in range(group.num_columns)}
    assert all("RLE_DICTIONARY" not in encodings[c] for c in ("prompt_ids", "response_ids", "loss_mask", "logprobs"))
    assert "RLE_DICTIONARY" in encodings["call_ids"] and "RLE_DICTIONARY" in encodings["session_id"]
