"""`polar report`: pages of a real `polar run` folder and of a scored batch folder, opened in real headless
Chromium inside the loopback-only namespace: every section and plot is in the rendered DOM, the token view
marks exactly the Parquet's loss_mask-1 tokens, the page names no network resource, a screenshot is taken."""
from __future__ import annotations

import dataclasses
import html as html_lib
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from polar.cli import build_parser
from polar.report.cli import write_report
from polar.report.data import ReportError, locate
from polar.report.tokens import mask_runs, terminal_lines
from polar_traj.build import BuildConfig
from polar_traj.outcomes import parse_outcomes
from polar_traj.pipeline import Selection, build_parquet
from polar_traj.records import CallRecord, append_record

ROOT = Path(__file__).resolve().parents[3]
SECTIONS = ("header", "status", "rewards", "groups", "calls", "trainer-tokens", "chains", "stages", "samples",
            "trajectory")
BATCH_PLOTS = ("status", "reward-task", "reward-harness", "group-reward", "group-advantage", "latency",
               "call-tokens", "trainer-tokens", "chains", "stages")


def chromium(*args: str, cwd: Path) -> str:
    exe = shutil.which("chromium")
    if exe is None:
        pytest.fail("chromium is not installed (make setup installs Debian's chromium)")
    done = subprocess.run([exe, "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={cwd / 'profile'}",
                           "--no-first-run", "--disable-extensions", "--disable-background-networking", *args],
                          capture_output=True, text=True, timeout=120, cwd=cwd)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def dom(page: Path, fragment: str = "") -> str:
    return chromium("--dump-dom", "--virtual-time-budget=3000", page.resolve().as_uri() + fragment, cwd=page.parent)


def png_size_and_colours(path: Path) -> tuple[int, int, int]:
    """(width, height, distinct byte values of the decoded pixel rows): a blank page has very few."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    idat, pos = b"", 8
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        if kind == b"IDAT":
            idat += data[pos + 8:pos + 8 + length]
        pos += 12 + length
    return width, height, len(set(zlib.decompress(idat)[: 4_000_000]))


def token_view(rendered: str) -> str:
    """The token view's rendered body (the legend above it has sample spans too)."""
    return rendered[rendered.index('id="tv-body"'):]


def no_network_references(html: str) -> None:
    """Nothing the page loads is remote: no src/href/url()/@import naming a scheme other than data: or #."""
    for m in re.finditer(r'(?:src|href)\s*=\s*"([^"]*)"|url\(([^)]*)\)|@import', html):
        target = (m.group(1) or m.group(2) or "@import").strip("'\" ")
        assert target.startswith(("#", "data:")), f"page references {target!r}"
    assert "default-src 'none'" in html


# -- a real `polar run` folder -------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def run_folder(tmp_path_factory, tiny_model_dir, policies_dir, tools_bin) -> Path:
    """A real pi session; the runner keeps a long-context view of the model (tokenizer) under model/."""
    out = tmp_path_factory.mktemp("report-run") / "run"
    env = dict(os.environ, PATH=f"{tools_bin}{os.pathsep}{os.environ['PATH']}")
    done = subprocess.run([sys.executable, "-m", "polar.cli", "run", "--adapter", "pi", "--runtime", "local",
                           "--instruction", "Create polar.txt", "--policy", str(policies_dir / "shell-once.yaml"),
                           "--model", str(tiny_model_dir), "--out", str(out),
                           "--confdir", str(out.parent / "mitm")], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return out


def test_run_folder_page_in_chromium(run_folder: Path):
    page = run_folder / "report.html"
    cli = subprocess.run([sys.executable, "-m", "polar.cli", "report", str(run_folder)], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert cli.returncode == 0, cli.stderr
    assert page.is_file() and f"wrote {page}" in cli.stdout
    html = page.read_text()
    no_network_references(html)
    rows = pq.read_table(run_folder / "trajectories.parquet").to_pylist()
    row = rows[0]
    rendered = dom(page, "#traj=" + row["trajectory_id"])
    for sid in SECTIONS:
        assert f'id="{sid}"' in rendered, sid
    for plot in ("status", "latency", "call-tokens", "trainer-tokens", "chains", "stages"):
        assert f'data-plot="{plot}"' in rendered, plot
    assert "No rewards in this run" in rendered  # a plain run is not scored: the section says so
    # the token view drew this trajectory: one span per response token, mask-1 ones marked
    view = token_view(rendered)
    assert view.count('class="t m1"') == sum(row["loss_mask"]) > 0
    assert view.count('class="t m0"') == len(row["loss_mask"]) - sum(row["loss_mask"])
    text = html_lib.unescape(re.sub(r"<[^>]+>", "", view[view.index("sampled: call 1"):]))  # what a reader sees
    assert '<tool_call>\n{"name": "bash"' in text and "<tool_response>" in text, text[:600]
    shot = run_folder / "report.png"
    chromium(f"--screenshot={shot}", "--window-size=1366,2400", page.resolve().as_uri(), cwd=run_folder)
    width, height, colours = png_size_and_colours(shot)
    assert (width, height) == (1366, 2400) and colours > 50


def test_terminal_lines_match_the_table(run_folder: Path):
    row = pq.read_table(run_folder / "trajectories.parquet").to_pylist()[0]
    lines = terminal_lines(row, lambda ids: "".join(f"<{i}>" for i in ids), shown=10_000)
    sampled = [ln for ln in lines[2:] if re.match(r"\s+\d+\s+1\s", ln)]
    assert len(sampled) == sum(row["loss_mask"])
    assert len(lines) - 2 == len(sampled) + sum(not r.sampled for r in mask_runs(row["loss_mask"]))


# -- a scored batch folder (hand-built CallRecords of the tiny model's tokens, results as SampleResult JSON) ---

def _records(tok, task: str, sample: str, reward_text: str, t0: float) -> list[CallRecord]:
    system = tok.encode(tok.apply_chat_template([{"role": "system", "content": f"Solve {task}."},
                                                 {"role": "user", "content": "Create polar.txt"}],
                                                tokenize=False, add_generation_prompt=True))
    first = tok.encode('<think>\nuse the shell\n</think>\n\n<tool_call>\n{"name": "bash", "arguments": '
                       '{"command": "echo polar > polar.txt"}}\n</tool_call><|im_end|>')
    between = tok.encode("\n<|im_start|>user\n<tool_response>\n(no output)\n</tool_response><|im_end|>\n"
                         "<|im_start|>assistant\n")
    second = tok.encode(f"{reward_text}<|im_end|>")
    calls = [(list(system), first), (list(system) + first + between, second)]
    out = []
    for n, (prompt, output) in enumerate(calls):
        out.append(CallRecord(
            call_id=f"{sample}-c{n}", task_id=task, session_id=sample, api="openai_chat", model="tiny", stream=True,
            started_at=t0 + n, ended_at=t0 + n + 0.2 + 0.1 * n, latency_ms=200.0 + 100 * n, policy_version=3,
            prompt_ids=tuple(prompt), output_ids=tuple(output),
            output_logprobs=tuple(-0.5 * (k % 9) for k in range(len(output))), finish_reason="stop",
            prefix_source="substituted" if n else "rendered:first_call", parent_call_id=None,
            request={"model": "tiny", "messages": []}, response=None, error=None, flags=()))
    return out


def make_batch(root: Path, tiny_model_dir: Path) -> Path:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    plan = [("fix-a", "pi", 1.0, "completed"), ("fix-a", "pi", 0.0, "completed"), ("fix-a", "codex", 1.0,
            "completed"), ("fix-a", "codex", 0.0, "timeout"), ("fix-b", "pi", 1.0, "completed"),
            ("fix-b", "codex", None, "error")]
    for i, (task, harness, reward, status) in enumerate(plan):
        sample = f"{task}-{harness}-{i}"
        folder = root / "samples" / sample
        for r in _records(tok, task, sample, "Done." if reward else "I could not.", 1000.0 + 10 * i):
            capture = append_record(folder / "attempt-1" / "captures", r)
        failure = {"timeout": "agent_timeout", "error": "infrastructure"}.get(status)
        entry = {"session_id": sample, "reward": reward, "status": status, "failure": failure,
                 "reason": "sandbox failed to start" if status == "error" else None, "group_id": task,
                 "harness": harness}
        built = build_parquet(Selection(folder / "attempt-1" / "captures"), root / "trajectories" / f"{sample}.parquet",
                              BuildConfig(), parse_outcomes([entry]))
        result = {"sample_id": sample, "task_id": task, "group_id": task, "adapter": harness, "status": status,
                  "failure": failure, "reason": entry["reason"], "reward": reward, "weight": 1.0, "exit_code": 0,
                  "evaluator_output": "", "timings": {"prepare_s": 1.0 + i, "run_s": 5.0, "evaluate_s": 0.5,
                                                      "postrun_s": 0.25},
                  "trajectories": str(built.path), "capture_files": [str(capture)], "node": "node-1",
                  "tampered": ["conftest.py"] if i == 1 else [],
                  "suspicious": ["calc.py: process exit (os._exit)"] if i == 1 else [],
                  "attempts": 2 if i == 2 else 1, "reassigned_from": ["node-2"] if i == 2 else []}
        (folder / "result.json").write_text(json.dumps(result))
    (root / "batch.json").write_text(json.dumps({"batch_id": "b1", "engine": "polar serve (reference)",
                                                 "model": str(tiny_model_dir), "wall_s": 42.0, "group_size": 2}))
    return root


def test_batch_page_in_chromium(tmp_path, tiny_model_dir):
    batch = make_batch(tmp_path / "batch", tiny_model_dir)
    layout = locate(batch)
    assert layout.kind == "batch" and len(layout.result_files) == 6 and layout.tokenizer == tiny_model_dir
    page = write_report(batch, tmp_path / "out" / "report.html")
    no_network_references(page.read_text())
    rendered = dom(page)
    for sid in SECTIONS:
        assert f'id="{sid}"' in rendered, sid
    for plot in BATCH_PLOTS:
        assert f'data-plot="{plot}"' in rendered, plot
    assert "sandbox failed to start" in rendered and "agent_timeout" in rendered
    assert "1 sample(s) tampered with the verifier" in rendered
    assert "1 sample(s) with suspicious changes" in rendered and "calc.py: process exit (os._exit)" in rendered
    assert "1 sample(s) reassigned" in rendered  # its node was lost (workers/heartbeat.py)
    assert re.search(r"<td[^>]*>2</td><td[^>]*>node-2</td>", rendered)
    assert re.search(r"<td[^>]*>fix-a-pi-1</td><td[^>]*>fix-a</td><td[^>]*>0</td><td[^>]*>conftest.py</td>", rendered)
    assert rendered.count('<tr><td><a href="#traj=') == 6  # one table row per sample, each linked
    # parts scored one sample at a time: the page computes the group advantages over the batch
    assert "computed here over the batch" in rendered
    assert re.search(r'<a href="#traj=fix-a-pi-1/[^"]*">fix-a-pi-1</a></td>(<td[^>]*>[^<]*</td>){5}'
                     r'<td data-v="0.0">0</td><td data-v="-0.5">-0.5</td>', rendered)
    # default view: the first row of the sample table; any other through #traj=
    rows = {r["session_id"]: r for r in pq.read_table(batch / "trajectories").to_pylist()}
    first = re.search(r'<tr><td><a href="#traj=([^"]+)">', rendered).group(1)
    assert token_view(rendered).count('class="t m1"') == sum(rows[first.split("/")[0]]["loss_mask"]) > 0
    other = rows["fix-a-pi-1"]
    assert sum(other["loss_mask"]) != sum(rows[first.split("/")[0]]["loss_mask"])
    assert token_view(dom(page, "#traj=" + other["trajectory_id"])).count('class="t m1"') == sum(other["loss_mask"])
    errored = [r for r in rows.values() if r["status"] == "error"][0]
    assert sum(errored["loss_mask"]) == 0  # infrastructure failure: masked out, so the view marks none
    assert token_view(dom(page, "#traj=" + errored["trajectory_id"])).count('class="t m1"') == 0
    shot = tmp_path / "out" / "batch.png"
    chromium(f"--screenshot={shot}", "--window-size=1366,3200", page.resolve().as_uri(), cwd=tmp_path / "out")
    assert png_size_and_colours(shot)[2] > 50


def test_status_card_counts_cancelled_and_masked_samples_and_names_call_errors(tmp_path, tiny_model_dir):
    """A cancelled workers' batch: the samples batch.json planned that have no result are counted as cancelled
    (outcome.json says how it ended), masked ones are counted, and each failed LLM call's error is shown; the
    engine comes from what the nodes recorded in the results when batch.json does not name it."""
    from transformers import AutoTokenizer

    from polar.report.data import load
    from polar.report.sections import header, status

    batch = make_batch(tmp_path / "batch", tiny_model_dir)
    info = json.loads((batch / "batch.json").read_text())
    del info["engine"], info["model"]
    finished = [p.parent.name for p in sorted((batch / "samples").glob("*/result.json"))]
    info["samples"] = [{"sample_id": s, "task_id": "fix-a", "group_id": "fix-a"} for s in finished + ["u1", "u2"]]
    (batch / "batch.json").write_text(json.dumps(info))
    for p in (batch / "samples").glob("*/result.json"):
        result = json.loads(p.read_text())
        p.write_text(json.dumps(dict(result, engine="sglang at http://127.0.0.1:30000", model=str(tiny_model_dir))))
    failed = _records(AutoTokenizer.from_pretrained(tiny_model_dir), "fix-b", "fix-b-codex-5", "x", 2000.0)[0]
    capture = json.loads((batch / "samples" / "fix-b-codex-5" / "result.json").read_text())["capture_files"][0]
    append_record(Path(capture).parent.parent, dataclasses.replace(
        failed, call_id="fix-b-codex-5-c9", output_ids=(), output_logprobs=(), error="engine down: 127.0.0.1:30000"))
    running = status(load(batch))
    assert "8 samples: 4 completed, 1 timed out, 1 masked" in html_lib.unescape(running)
    assert "2 not finished yet" in running and "Every sample completed" not in running
    (batch / "outcome.json").write_text(json.dumps({"batch_id": "b1", "status": "cancelled"}))
    page = html_lib.unescape(status(load(batch)))
    assert "2 cancelled (never finished: the batch ended cancelled); batch cancelled." in page
    assert "1 LLM call(s) ended in an error" in page and "engine down: 127.0.0.1:30000" in page
    top = html_lib.unescape(header(load(batch)))
    assert "sglang at http://127.0.0.1:30000" in top and tiny_model_dir.name in top


def test_a_failed_run_says_why_it_has_no_samples(tmp_path):
    """A `polar run` whose engine was down recorded no call: the report says so with the run's own causes."""
    from polar.report.data import load
    from polar.report.sections import status

    (tmp_path / "logs").mkdir()
    (tmp_path / "run.json").write_text(json.dumps({"status": "error", "exit_code": 1, "timed_out": False,
                                                   "error": None, "files": [], "session": {"adapter": "pi"}}))
    (tmp_path / "logs" / "proxy.log").write_text("polar proxy: engine http://127.0.0.1:9 down (connection refused)\n")
    (tmp_path / "harness.stderr").write_text("Error: 503 no engine\n")
    page = html_lib.unescape(status(load(tmp_path)))
    assert "No samples" in page and "run status error, harness exit 1" in page
    assert "polar proxy: engine http://127.0.0.1:9 down (connection refused)" in page and "503 no engine" in page


def test_a_parquet_file_alone(tmp_path, tiny_model_dir):
    batch = make_batch(tmp_path / "batch", tiny_model_dir)
    part = sorted((batch / "trajectories").glob("*.parquet"))[0]
    page = write_report(part, tmp_path / "part.html", tokenizer=tiny_model_dir)
    html = page.read_text()
    assert "No stage timings" in html and "No CallRecords here" in html  # absent data is said, not drawn


def test_bad_sources_are_named(tmp_path):
    with pytest.raises(ReportError, match="no such file"):
        locate(tmp_path / "missing")
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(ReportError, match="notes.txt: expected a run folder"):
        locate(tmp_path / "notes.txt")
    with pytest.raises(ReportError, match="not a run folder"):
        locate(tmp_path)
    done = subprocess.run([sys.executable, "-m", "polar.cli", "report", str(tmp_path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "polar report:" in done.stderr and "not a run folder" in done.stderr


def test_report_is_registered():
    args = build_parser().parse_args(["report", "runs/x", "-o", "r.html"])
    assert (args.source, args.out, args.max_token_views) == (Path("runs/x"), Path("r.html"), 200)
