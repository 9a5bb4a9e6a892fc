"""`polar submit | status | cancel | policy` from the command line: registration, argument errors, the fence
against a real Redis, status and cancel of a batch that no worker has picked up yet."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from polar.cli import build_parser, main


def test_subcommands_are_registered():
    args = build_parser().parse_args(["submit", "tasks.yaml", "--group-size", "8", "--adapter", "pi", "--wait"])
    assert (args.group_size, args.adapter, args.wait, args.min_groups) == (8, "pi", True, None)
    for argv in (["status", "b1"], ["cancel", "b1"], ["policy", "pause"], ["batches"], ["nodes"]):
        assert build_parser().parse_args(argv).func


def test_submit_reports_bad_tasks(tmp_path: Path, redis_base: str, capsys):
    bad = tmp_path / "tasks.yaml"
    bad.write_text(yaml.safe_dump({"tasks": [{"task_id": "a b", "instruction": "x", "adapter": "pi",
                                              "evaluator": {"command": "true"}}]}))
    assert main(["submit", str(bad), "--broker", redis_base + "/1"]) == 2
    assert "task_id" in capsys.readouterr().err
    assert main(["status", "no-such-batch", "--broker", redis_base + "/1"]) == 2
    assert "no batch 'no-such-batch'" in capsys.readouterr().err


def test_submit_sampling_flags(tmp_path: Path, redis_base: str, capsys):
    tasks = tmp_path / "tasks.yaml"
    tasks.write_text(yaml.safe_dump({"tasks": [{"task_id": "a", "instruction": "x", "adapter": "pi", "image": "host",
                                                "evaluator": {"command": "true"}, "submit": []}]}))
    broker = ["--broker", redis_base + "/3", "--out", str(tmp_path / "out")]
    assert main(["submit", str(tasks), "--temperature", "-1", *broker]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "polar submit: sampling temperature: expected 0 or more, got -1.0"
    assert main(["submit", str(tasks), "--top-p", "1.5", *broker]) == 2
    assert "top_p" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()  # nothing was queued
    with pytest.raises(SystemExit):
        main(["submit", str(tasks), "--top-k", "many", *broker])
    assert "argument --top-k: invalid int value: 'many'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["submit", str(tasks), "--temprature", "1", *broker])
    assert "unrecognized arguments: --temprature" in capsys.readouterr().err
    assert main(["submit", str(tasks), "--temperature", "0.7", "--seed", "3", "--group-size", "1", *broker]) == 0
    batch_id = capsys.readouterr().out.split()[1].rstrip(":")
    manifest = json.loads((tmp_path / "out" / batch_id / "batch.json").read_text())
    assert manifest["sampling"] == {"temperature": 0.7, "seed": 3}
    main(["cancel", batch_id, "--broker", redis_base + "/3"])


def test_status_and_cancel_of_a_queued_batch(tmp_path: Path, redis_base: str, capsys):
    tasks = tmp_path / "tasks.yaml"
    tasks.write_text(yaml.safe_dump({"tasks": [{"task_id": "a", "instruction": "x", "adapter": "pi", "image": "host",
                                                "evaluator": {"command": "true"}, "submit": []}]}))
    broker = ["--broker", redis_base + "/2"]
    assert main(["submit", str(tasks), "--group-size", "2", "--out", str(tmp_path / "out"), *broker]) == 0
    batch_id = capsys.readouterr().out.split()[1].rstrip(":")
    assert (tmp_path / "out" / batch_id / "batch.json").is_file()
    assert main(["status", batch_id, "--json", *broker]) == 0
    assert '"queued": 2' in capsys.readouterr().out
    assert main(["cancel", batch_id, *broker]) == 0
    assert main(["status", batch_id, *broker]) == 0
    assert "2 cancelled" in capsys.readouterr().out
    assert main(["cancel", batch_id, *broker]) == 1  # already finished
    capsys.readouterr()
    assert main(["submit", str(tasks), "--group-size", "1", "--out", str(tmp_path / "out"), *broker]) == 0
    newer = capsys.readouterr().out.split()[1].rstrip(":")
    assert main(["batches", *broker]) == 0  # newest first, each with its progress and folder
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == [newer, batch_id]
    assert "2 cancelled" in lines[1] and lines[1].endswith(str(tmp_path / "out" / batch_id))
    assert main(["batches", "--limit", "1", "--json", *broker]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [(b["batch_id"], b["queued"]) for b in json.loads(out[0])] == [(newer, 1)]


def test_policy_pause_and_resume(redis_base: str, capsys):
    broker = ["--broker", redis_base + "/3"]  # the fence lives in the sessions db beside it: db 0
    assert main(["policy", "pause", "--timeout", "10", *broker]) == 0
    assert main(["policy", "status", *broker]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "policy: paused"
    assert main(["status", *broker]) == 0  # polar status says so: a forgotten pause stalls every batch
    assert capsys.readouterr().out.splitlines()[-1].startswith("fence: PAUSED")
    assert main(["policy", "resume", *broker]) == 0
    assert main(["policy", "status", *broker]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "policy: running"
    assert main(["status", *broker]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "fence: running"


def test_wait_verdict_names_masked_reasons_and_cancels():
    """`polar submit --wait` exits 1 for a batch whose samples were masked (beyond --max-masked) or that was
    cancelled, with the top reasons and their counts."""
    from types import SimpleNamespace

    from workers.batches import Progress
    from workers.cli import wait_verdict

    down = "every LLM call failed (3): polar: the inference engine at http://e:1 is unreachable"
    results = [{"status": "error", "failure": "infrastructure", "reason": down}] * 3 + [
        {"status": "error", "failure": "infrastructure", "reason": "evaluator: no pytest"},
        {"status": "completed", "failure": None, "reason": None}]
    batch = SimpleNamespace(batch_id="b1", results=lambda: results)

    def progress(masked: int, status: str = "completed", cancelled: int = 0) -> Progress:
        return Progress(5, 0, 0, 5 - masked, masked, cancelled, 1, 1, 0.0, status, {})

    assert wait_verdict(batch, progress(4)) == f"4 of 5 samples masked (allowed 0): 3x {down}; 1x evaluator: no pytest"
    assert wait_verdict(batch, progress(4), max_masked=4) is None
    assert wait_verdict(batch, progress(0)) is None
    assert wait_verdict(batch, progress(0, "cancelled", 2)) == "batch b1 was cancelled (2 samples did not finish)"


def test_progress_into_a_log_is_one_line_per_change():
    """`polar submit --wait` (and `make demo`) into a file or pipe: no bar redraws (`\\r`), one line each time
    the counts change (a demo log was 65 KB of redraws)."""
    import io

    from polar.progress import Progress
    from workers.cli import follow

    def progress(done: int, running: int, status: str = "running") -> Progress:
        return Progress(4, 4 - done - running, running, done, 0, 0, done // 2, 2, None if not done else 1.0, status, {})

    polls = [progress(0, 0), progress(0, 2), progress(0, 2), progress(0, 2), progress(2, 2), progress(4, 0, "completed")]

    class Batch:
        manifest = type("M", (), {"samples": [1, 2, 3, 4]})()

        def wait(self, timeout, on_progress):
            for p in polls:
                on_progress(p)
            return polls[-1]

    log = io.StringIO()
    assert follow(Batch(), None, log) is polls[-1]
    lines = log.getvalue().splitlines()
    assert "\r" not in log.getvalue() and len(lines) == 4  # six polls, four distinct states
    assert lines[-1] == f"progress: {polls[-1].line()}"


def test_submit_without_out_writes_where_the_nodes_do(tmp_path: Path, redis_base: str, capsys, monkeypatch):
    """No --out: the output root the live nodes announce in their heartbeat, not the client's ./runs/batches
    (a folder on another machine, or one no node writes to); said on the batch line."""
    from workers import batches, liveness
    from workers.cli import output_root

    monkeypatch.delenv("POLAR_OUTPUT_ROOT", raising=False)
    monkeypatch.chdir(tmp_path)
    r = batches.connect(redis_base + "/5")
    r.flushdb()
    shared = tmp_path / "shared"
    liveness.beat(r, "w1", 30, {"state": "alive", "load": 0, "in_flight": [], "output_root": str(shared)})
    tasks = tmp_path / "tasks.yaml"
    tasks.write_text(yaml.safe_dump({"tasks": [{"task_id": "a", "instruction": "x", "adapter": "pi", "image": "host",
                                                "evaluator": {"command": "true"}, "submit": []}]}))
    assert main(["submit", str(tasks), "--group-size", "1", "--broker", redis_base + "/5"]) == 0
    line = capsys.readouterr().out
    assert f"folder {shared}/" in line and "(the nodes' POLAR_OUTPUT_ROOT)" in line, line
    assert not (tmp_path / "runs").exists() and len(list(shared.iterdir())) == 1
    two = [liveness.NodeStatus("a", "alive", 1.0, 0, (), "/x"), liveness.NodeStatus("b", "alive", 1.0, 0, (), "/y")]
    with pytest.raises(ValueError, match=r"different output roots \(/x, /y\): give --out"):
        output_root(None, two)
    assert output_root(Path("/mine"), two) == (Path("/mine"), "--out")
    out, where = output_root(None, [])
    assert out == Path("runs/batches") and "give --out the nodes' POLAR_OUTPUT_ROOT" in where


def test_a_batch_with_no_live_node_says_so(tmp_path: Path, redis_base: str, capsys):
    """Queued, and one line says no node will take it until one starts (before: `queued` until the timeout)."""
    from workers import batches, liveness

    r = batches.connect(redis_base + "/9")
    r.flushdb()
    tasks = tmp_path / "tasks.yaml"
    tasks.write_text(yaml.safe_dump({"tasks": [{"task_id": "a", "instruction": "x", "adapter": "pi", "image": "host",
                                                "evaluator": {"command": "true"}, "submit": []}]}))
    broker = ["--broker", redis_base + "/9", "--out", str(tmp_path / "out")]
    assert main(["submit", str(tasks), "--group-size", "1", *broker]) == 0
    done = capsys.readouterr()
    assert done.err.strip() == (f"polar submit: no worker node is alive on this broker: the batch stays queued "
                                f"until one starts: `POLAR_BROKER={redis_base}/9 celery -A workers worker` on a "
                                "node (`polar nodes` lists them)")
    main(["cancel", done.out.split()[1].rstrip(":"), "--broker", redis_base + "/9"])
    liveness.beat(r, "w1", 30, {"state": "alive", "load": 0, "in_flight": [], "output_root": str(tmp_path)})
    assert main(["submit", str(tasks), "--group-size", "1", *broker]) == 0
    done = capsys.readouterr()
    assert "no worker node" not in done.err
    main(["cancel", done.out.split()[1].rstrip(":"), "--broker", redis_base + "/9"])
