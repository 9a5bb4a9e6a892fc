"""`polar traj build | stats | export` through polar.cli."""
from __future__ import annotations

import io
import json
import subprocess
import sys

import numpy as np

from polar.cli import main
from polar_traj import cli as traj_cli
from polar_traj.parquet import read
from polar_traj.pipeline import Selection, build_parquet


def test_build_stats_export(capture, write_records, chain_session, tmp_path, capsys):
    write_records(capture, chain_session(3, session_id="s1") + chain_session(2, session_id="s2"))
    rewards = tmp_path / "rewards.yaml"
    rewards.write_text("- {session_id: s1, reward: 1, harness: codex}\n- {session_id: s2, reward: 0}\n")
    out = tmp_path / "t.parquet"
    assert main(["traj", "build", str(capture), "-o", str(out), "--rewards", str(rewards), "--std-scale",
                 "--weight", "session"]) == 0
    printed = capsys.readouterr().out
    assert f"wrote 2 trajectories to {out}" in printed and "2 sessions, 5 calls -> 2 trajectories" in printed
    table = read(out)
    assert sorted(table.column("reward").to_pylist()) == [0.0, 1.0]
    assert sorted(table.column("advantage").to_pylist())[0] < 0

    assert main(["traj", "stats", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "2 trajectories, 2 sessions, 1 tasks" in printed and "merge stats" in printed and "codex" in printed
    assert main(["traj", "stats", str(out), "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["merge"]["prefix_merge"]["calls_merged"] == 3

    for fmt, name in (("slime", "s.jsonl"), ("verl", "v.npz"), ("sft", "f.jsonl")):
        assert main(["traj", "export", str(out), "--format", fmt, "-o", str(tmp_path / name)]) == 0
        assert f"wrote 2 {fmt} records" in capsys.readouterr().out
    with np.load(tmp_path / "v.npz") as batch:
        assert batch["input_ids"].shape[0] == 2


def test_per_request_and_filters(capture, write_records, chain_session, tmp_path, capsys):
    write_records(capture, chain_session(3, session_id="s1") + chain_session(2, session_id="s2", task_id="other"))
    out = tmp_path / "t.parquet"
    assert main(["traj", "build", str(capture), "-o", str(out), "--strategy", "per_request", "--task", "task"]) == 0
    assert read(out).column("strategy").to_pylist() == ["per_request"] * 3


def test_bad_input_is_one_line_and_exit_2(capture, tmp_path, capsys):
    assert main(["traj", "build", str(tmp_path / "missing"), "-o", str(tmp_path / "x.parquet")]) == 2
    assert "polar traj build: error: no capture directory" in capsys.readouterr().err
    bad = tmp_path / "r.json"
    bad.write_text('[{"session_id": "s", "status": "weird"}]')
    assert main(["traj", "build", str(capture), "-o", str(tmp_path / "x.parquet"), "--rewards", str(bad)]) == 2
    assert "status 'weird'" in capsys.readouterr().err


def test_python_dash_m_entry(capture, write_records, chain_session, tmp_path):
    write_records(capture, chain_session(2))
    out = tmp_path / "t.parquet"
    done = subprocess.run([sys.executable, "-m", "polar.cli", "traj", "build", str(capture), "-o", str(out)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert read(out).num_rows == 1


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_bar_on_large_inputs_goes_to_stderr(monkeypatch):
    fake = _Tty()
    monkeypatch.setattr(sys, "stderr", fake)
    list(traj_cli._progress(True)(list(range(traj_cli.PROGRESS_MIN_SESSIONS))))
    assert "sessions" in fake.getvalue()
    small = _Tty()
    monkeypatch.setattr(sys, "stderr", small)
    list(traj_cli._progress(True)(list(range(3))))
    list(traj_cli._progress(False)(list(range(100))))
    assert small.getvalue() == ""


def test_empty_capture_is_refused_but_an_empty_table_is_taken(capture, tmp_path, capsys):
    """An empty capture folder is a wrong path far more often than a finished build: the CLI says so and writes
    nothing; an empty table (the library still writes one) is taken by every command."""
    out = tmp_path / "empty.parquet"
    assert main(["traj", "build", str(capture), "-o", str(out)]) == 2
    assert f"no capture files (TASK/SESSION.jsonl) in {capture}" in capsys.readouterr().err and not out.exists()
    build_parquet(Selection(str(capture)), out)
    assert read(out).num_rows == 0
    assert main(["traj", "stats", str(out)]) == 0
    for fmt in ("slime", "verl", "sft"):
        assert main(["traj", "export", str(out), "--format", fmt, "-o", str(tmp_path / f"x.{fmt}")]) == 0
    assert "wrote 0 sft records" in capsys.readouterr().out
