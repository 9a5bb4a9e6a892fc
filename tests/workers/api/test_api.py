"""`polar api` end to end: a real uvicorn server (`polar api`) on 127.0.0.1 in front of a real Redis and one real
`celery -A workers worker` node, Pi sessions in bubblewrap against the reference server with the tests' scripted
coin policy (tests/workers/rollout_policy.yaml: one shell call, then "Done."). One cluster for the module."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Callable, Iterator

import httpx
import pyarrow.parquet as pq
import pytest

from polar import PolarClient
from polar.run.services import context_view
from polar_mitm.launch import free_port
from polar_traj import read
from tests.workers.cluster import Node, node_env, start_node
from workers.api.callbacks import verify

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[3]
POLICY = ROOT / "tests" / "workers" / "rollout_policy.yaml"
TOKEN = "test-token-" + "x" * 16
COIN = {"instruction": "Flip the coin.", "image": "host", "timeout_s": 240,
        "evaluator": {"command": "grep -qx heads coin.txt", "timeout_s": 30}, "submit": ["coin.txt"]}


@dataclass
class Api:
    url: str
    root: Path
    broker: str
    sessions: str
    log: Path
    node: Node

    def http(self, token: str | None = TOKEN) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers={"authorization": f"Bearer {token}"} if token else {},
                            timeout=60)

    def short(self, group_size: int, task_id: str = "coin", **extra) -> dict:
        body = {"harness": "pi", "runtime": "bwrap", "trajectory_strategy": "prefix_merging",
                "group_size": group_size, "task_id": task_id, **COIN, **extra}
        with self.http() as c:
            answer = c.post("/api/tasks", json=body)
        assert answer.status_code == 201, answer.text
        return answer.json()

    def wait(self, batch_id: str, timeout_s: float = 300.0, until: Callable[[dict], bool] | None = None) -> dict:
        deadline = time.monotonic() + timeout_s
        with self.http() as c:
            while True:
                status = c.get(f"/rollout/task/{batch_id}").json()
                if status["settled"] and (until is None or until(status)):
                    return status
                if time.monotonic() > deadline:
                    raise AssertionError(f"batch not done: {json.dumps(status)[:2000]}\n"
                                         f"{self.node.log.read_text(errors='replace')[-3000:]}")
                time.sleep(0.3)


def start_api(root: Path, broker: str, sessions: str, log: Path, *extra: str) -> tuple[subprocess.Popen, str]:
    """`polar api` on a free port (SSE heartbeats every second, callbacks tried 3 times, `extra` options); waits
    for /health."""
    port = free_port()
    cmd = [sys.executable, "-m", "polar.cli", "api", "--port", str(port), "--broker", broker, "--sessions", sessions,
           "--out", str(root / "batches"), "--tasks-root", str(root), "--heartbeat", "1", "--callback-attempts", "3",
           *extra]
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, "POLAR_API_TOKEN": TOKEN}, stdout=out,
                                stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            stop_api(proc)
            raise RuntimeError(f"polar api did not start:\n{log.read_text(errors='replace')[-3000:]}")
        time.sleep(0.2)


def stop_api(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


@pytest.fixture(scope="module")
def api(tmp_path_factory, tiny_model_dir: Path, start_reference_server, redis_base: str) -> Iterator[Api]:
    root = tmp_path_factory.mktemp("api")
    model = context_view(tiny_model_dir, 65536, root / "model")
    engine = start_reference_server(POLICY, model)
    broker, sessions = redis_base + "/1", redis_base + "/0"
    node = start_node(node_env(broker, sessions, engine, model, root, "api1", runtime="bwrap"), concurrency=2)
    try:
        proc, url = start_api(root, broker, sessions, root / "api.log")
        try:
            yield Api(url, root, broker, sessions, root / "api.log", node)
        finally:
            stop_api(proc)
    finally:
        node.stop()


class Receiver:
    """A trainer's callback endpoint on 127.0.0.1: records (headers, raw body) of each POST."""

    def __init__(self) -> None:
        got = self.got = []

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["content-length"]))
                got.append(({k.lower(): v for k, v in self.headers.items()}, body))
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/polar"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def test_task_request_by_curl_with_signed_callbacks(api: Api):
    receiver = Receiver()
    request = {"task_id": "coin", "instruction": COIN["instruction"], "num_samples": 2, "dispatch_priority": 0,
               "early_stop_min_usable_sessions": None, "timeout_seconds": 240, "runtime": "bwrap",
               "agent": {"harness": "pi", "model_name": "polar-policy", "env": {}},
               "builder": {"strategy": "prefix_merging"}, "evaluator": COIN["evaluator"],
               "submit": COIN["submit"], "callback_url": receiver.url, "metadata": {"source": "curl"}}
    done = subprocess.run(["curl", "-sS", "-X", "POST", f"{api.url}/rollout/task/submit",
                           "-H", f"Authorization: Bearer {TOKEN}", "-H", "Content-Type: application/json",
                           "-d", json.dumps(request)], capture_output=True, text=True, timeout=60)
    submitted = json.loads(done.stdout)
    batch_id, secret = submitted["id"], submitted["secret"]
    assert submitted["samples"] == 2
    status = api.wait(batch_id, until=lambda s: s["callbacks"]["delivered"] + s["callbacks"]["failed"] >= 3)
    assert status["status"] == "completed" and status["progress"]["done"] + status["progress"]["masked"] == 2
    assert status["callbacks"] == {"delivered": 3, "failed": 0, "retried": 0, "last_error": None, "failures": []}
    kinds = sorted(h["x-polar-event"] for h, _ in receiver.got)
    assert kinds == ["group", "sample", "sample"]
    trusted = documented_check()
    for headers, body in receiver.got:
        assert verify(secret, headers, body), headers  # timestamp.batch_id.body, inside the replay window
        assert trusted(secret, headers, body) and not trusted(secret, headers, body + b" ")
        old = str(int(headers["x-polar-timestamp"]) - 301)
        assert not trusted(secret, {**headers, "x-polar-timestamp": old}, body)
        assert headers["x-polar-batch"] == batch_id and json.loads(body)["delivery"] == headers["x-polar-delivery"]
        assert not verify("another-secret", headers, body)
        assert not verify(secret, headers, body, now=int(headers["x-polar-timestamp"]) + 301)  # replayed later
        assert not verify(secret, {**headers, "x-polar-batch": "another-batch"}, body)
    bodies = [json.loads(b) for _, b in receiver.got]
    samples = {b["sample_id"]: b for b in bodies if b["event"] == "sample"}
    group = next(b for b in bodies if b["event"] == "group")
    assert set(group["advantages"]) == set(samples) and set(group["samples"]) == set(samples)
    assert {s: b["reward"] for s, b in samples.items()} == group["rewards"]
    receiver.server.shutdown()
    # The Parquet download is the batch folder's rows; the JSON rows too.
    with api.http() as c:
        answer = c.get(f"/api/batches/{batch_id}/trajectories.parquet")
        rows = c.get(f"/api/batches/{batch_id}/trajectories").json()
    assert answer.status_code == 200
    (api.root / "download.parquet").write_bytes(answer.content)
    downloaded = pq.read_table(api.root / "download.parquet").to_pylist()
    folder = read(api.root / "batches" / batch_id / "trajectories").to_pylist()
    assert downloaded == folder and len(folder) >= 2
    assert [r["trajectory_id"] for r in rows] == [r["trajectory_id"] for r in folder]
    assert rows[0]["prompt_ids"] == folder[0]["prompt_ids"]
    with api.http() as c:  # the page a dashboard sample links to
        page = c.get(f"/api/batches/{batch_id}/report")
    assert page.status_code == 200 and batch_id in page.text and "<html" in page.text.lower()


def documented_check():
    """The receiver's check docs/api.md gives for languages without `verify` (its block after `<!-- callback-check
    -->`), run as written."""
    text = (ROOT / "docs" / "api.md").read_text()
    block = text.split("<!-- callback-check -->\n```python\n", 1)[1].split("\n```", 1)[0]
    scope: dict = {}
    exec(compile(block, "docs/api.md", "exec"), scope)
    return scope["trusted"]


def sse_events(api: Api, seen: list, ready: threading.Event, stop: threading.Event) -> None:
    """Parse `GET /events` into (event, id, data) until `stop`."""
    with api.http() as c, c.stream("GET", "/events", timeout=httpx.Timeout(60, read=10)) as answer:
        kind, eid, data = None, None, []
        for line in answer.iter_lines():
            if line.startswith("event: "):
                kind = line[7:]
            elif line.startswith("id: "):
                eid = line[4:]
            elif line.startswith("data: "):
                data.append(line[6:])
            elif line == "" and kind:
                seen.append((kind, eid, json.loads("".join(data))))
                if kind == "hello":
                    ready.set()
                kind, eid, data = None, None, []
                if stop.is_set():
                    return


def test_events_stream_every_state_change_in_order(api: Api):
    seen: list = []
    ready, stop = threading.Event(), threading.Event()
    reader = threading.Thread(target=sse_events, args=(api, seen, ready, stop), daemon=True)
    reader.start()
    assert ready.wait(30)
    batch_id = api.short(4)["batch_id"]
    api.wait(batch_id)
    deadline = time.monotonic() + 30  # the events after the batch's end, and at least one heartbeat
    while not (any(k == "batch" and d.get("status") == "completed" for k, _, d in seen)
               and sum(k == "heartbeat" for k, _, _ in seen) >= 1):
        assert time.monotonic() < deadline, seen
        time.sleep(0.2)
    stop.set()
    ours = [(k, eid, d) for k, eid, d in seen if d.get("batch_id") == batch_id]
    ids = [tuple(map(int, eid.split("-"))) for _, eid, _ in ours]
    assert ids == sorted(ids)  # stream order
    stages: dict[str, list[str]] = {}
    for kind, _, d in ours:
        if kind == "sample":
            assert d["prev"] == (stages[d["sample_id"]][-1] if d["sample_id"] in stages else "queued")
            stages.setdefault(d["sample_id"], []).append(d["stage"])
    assert len(stages) == 4
    for sample, path in stages.items():
        assert path[:3] == ["prepare", "run", "postrun"] and path[3] in ("done", "masked") and len(path) == 4, path
    kinds = [k for k, _, _ in ours]
    assert kinds[0] == "batch" and kinds[-1] == "batch" and kinds.count("group") == 1
    assert kinds.index("group") > max(i for i, k in enumerate(kinds) if k == "sample")
    beat = next(d for k, _, d in seen if k == "heartbeat")
    assert beat["fence"] == {"paused": False} and [n["node"] for n in beat["nodes"]] == ["api1"]


def test_auth_bad_input_and_a_refusing_callback(api: Api):
    with api.http(token=None) as c:
        assert c.get("/health").status_code == 200
        for method, path in (("GET", "/rollout/status"), ("POST", "/api/tasks"), ("GET", "/events"),
                             ("GET", "/metrics"), ("GET", "/")):
            assert c.request(method, path).status_code == 401, path
    with api.http(token="wrong-token-wrong-token") as c:
        assert c.get("/rollout/status").status_code == 401
    with api.http() as c:
        answer = c.post("/rollout/task/submit", json={"task_id": "t", "instruction": "x", "num_samplez": 2,
                                                      "agent": {"harness": "pi"}, "evaluator": {"command": "true"}})
        assert answer.status_code == 422 and answer.json()["field"] == "num_samplez", answer.text
        answer = c.post("/api/tasks", json={"harness": "pi", "task_id": "t", "instruction": "x",
                                            "evaluator": {"command": "true", "timeout": 3}, "image": "host"})
        assert answer.status_code == 422 and answer.json()["field"] == "evaluator.timeout", answer.text
        answer = c.post("/api/tasks", json={"harness": "no-such-harness", **COIN, "task_id": "t"})
        assert answer.status_code == 422 and "no-such-harness" in answer.json()["error"], answer.text
        answer = c.post("/api/tasks", json={"harness": "pi", **COIN, "task_id": "t", "group_size": 999,
                                            "tasks": None, "metadata": {"pad": "y" * (2 << 20)}})
        assert answer.status_code == 413, answer.text
        assert c.get("/rollout/task/no-such-batch").status_code == 404
        many = [{"task_id": f"t{k}", **COIN} for k in range(5)]  # 5 x 999 samples: past --max-samples (4096)
        answer = c.post("/api/tasks", json={"harness": "pi", "group_size": 999, "tasks": many})
        assert answer.status_code == 422 and answer.json()["field"] == "group_size", answer.text
        assert c.get("/events", params={"after": "yesterday"}).json()["field"] == "after"
    refused = f"http://127.0.0.1:{free_port()}/nobody"  # nothing listens there
    batch_id = api.short(1, task_id="refused", callback_url=refused)["batch_id"]
    status = api.wait(batch_id, until=lambda s: s["callbacks"]["failed"] >= 2)
    assert status["status"] == "completed"
    assert status["callbacks"]["failed"] == 2 and status["callbacks"]["delivered"] == 0
    assert "ConnectError" in status["callbacks"]["last_error"] and "after 3 attempts" in status["callbacks"]["last_error"]


def test_http_client_matches_the_redis_client(api: Api, tmp_path: Path):
    tasks = tmp_path / "tasks.yaml"
    tasks.write_text(json.dumps({"tasks": [{"task_id": "sdk", "adapter": "pi", **COIN}]}))
    client = PolarClient(api.url, token=TOKEN)
    batch = client.submit(tasks, group_size=2)
    p = batch.wait(timeout=300)
    assert p.finished and p.done + p.masked == 2
    over_http = batch.trajectories()
    over_redis = PolarClient(api.broker).batch(batch.batch_id).trajectories()
    assert len(over_http) >= 2
    assert over_http.equals(over_redis)
    assert client.get_trajectories(batch.batch_id).equals(over_redis)
    assert sorted(r["sample_id"] for r in batch.results()) == sorted(batch.samples())
    assert not batch.cancel()  # already finished
    client.pause(timeout_s=30)
    assert client.is_paused() and PolarClient(api.broker).is_paused()
    client.resume()
    assert not client.is_paused()
    with api.http() as c:
        text = c.get("/metrics").text
    assert 'polar_samples{state="done"}' in text and 'polar_node_load{node="api1",state="alive"}' in text
    assert int(next(l for l in text.splitlines() if l.startswith("polar_llm_calls_total")).split()[1]) > 0


def test_a_harbor_folder_over_http(api: Api):
    """`PolarClient(url).submit(FOLDER)` of a Harbor folder (before: 422 `evaluator.python: expected
    module:function, got None`, a field the user never wrote): the service runs the folder as polar submit does,
    each sample scored by the task's own test.sh (this engine's policy does not solve them: reward 0)."""
    folder = api.root / "harbor"  # under the service's tasks root
    shutil.copytree(ROOT / "fixtures" / "harbor", folder, dirs_exist_ok=True)
    client = PolarClient(api.url, token=TOKEN)
    batch = client.submit(folder, group_size=1, adapter="pi")
    p = batch.wait(timeout=600)
    assert p.finished and p.done == 3, p.line()
    results = batch.results()
    assert sorted(r["task_id"] for r in results) == ["count-lines", "fix-mul", "write-hello"]
    assert all(r["status"] == "completed" and r["reward"] is not None for r in results), results
    with api.http() as c:  # a folder outside the tasks root is refused, naming the field
        refused = c.post("/api/tasks", json={"harness": "pi", "harbor": str(ROOT / "fixtures" / "harbor")})
    assert refused.status_code == 422 and "harbor" in refused.text and "outside" in refused.text, refused.text
    said = f"polar api: batches in {api.root / 'batches'} (--out), tasks read under {api.root} (--tasks-root)"
    assert said in api.log.read_text()  # where its folders go, said at start (issue 71 item 8)


def test_dashboard_in_headless_chromium(api: Api, tmp_path: Path):
    """The page, opened before the batch moves, shows its progress from 0 to done from /events alone, and lists the
    newest batch's samples; a batch cancelled before it ran has no green bar. It is served by a second `polar api`
    (stateless: both front the same Redis); stopping that one when the batch is done ends the page's event stream,
    so Chromium's virtual time runs out and it dumps the DOM it has then."""
    exe = shutil.which("chromium")
    if exe is None:
        pytest.fail("chromium is not installed (make setup installs Debian's chromium)")
    log = tmp_path / "api2.log"
    proc, url = start_api(api.root, api.broker, api.sessions, log)
    page = None
    try:
        with api.http() as c:  # held at the fence, the batch sits at 0 done until the page is watching
            assert c.post("/policy/pause", json={"timeout_s": 30}).status_code == 200
        stopped = api.short(2, task_id="stopped")["batch_id"]
        with api.http() as c:
            assert c.post(f"/api/batches/{stopped}/cancel").json()["cancelled"]
        time.sleep(1.1)  # batch ids sort by their second: the next one is the newest
        batch_id = api.short(2, task_id="dash")["batch_id"]
        page = subprocess.Popen([exe, "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={tmp_path / 'p'}",
                                 "--no-first-run", "--disable-extensions", "--disable-background-networking",
                                 "--virtual-time-budget=20000", "--dump-dom", f"{url}/?token={TOKEN}"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
        deadline = time.monotonic() + 60
        while "GET /events" not in log.read_text(errors="replace"):
            assert time.monotonic() < deadline and page.poll() is None, log.read_text(errors="replace")[-2000:]
            time.sleep(0.2)
        time.sleep(1.0)  # the page has drawn its snapshot (0 done) by the time its stream is open
    finally:
        with api.http() as c:
            c.post("/policy/resume")
    try:
        api.wait(batch_id)
        time.sleep(2.0)  # the last events reach the page
        stop_api(proc)
        out, err = page.communicate(timeout=120)
    finally:
        stop_api(proc) if proc.poll() is None else None
        if page is not None and page.poll() is None:
            page.kill()
    assert f'data-batch="{batch_id}"' in out, (out[-3000:], err[-3000:])
    row = out[out.index(f'data-batch="{batch_id}"'):]
    row = row[:row.index("</tr>")]
    seen = row.split('data-seen="', 1)[1].split('"', 1)[0].split("|")
    assert seen[0].startswith("0/2") and seen[-1] == "2/2 completed", seen
    assert 'data-status="completed"' in row and 'class="bar done"' in row
    cancelled = out[out.index(f'data-batch="{stopped}"'):]
    cancelled = cancelled[:cancelled.index("</tr>")]
    assert 'data-status="cancelled"' in cancelled and 'class="bar stopped"' in cancelled, cancelled
    listed = out[out.index('id="samples"'):]
    assert f'of {batch_id}<' in out and f"{batch_id}.dash." in listed and stopped not in listed, listed[:2000]
    requested = [line.split('"')[1] for line in log.read_text(errors="replace").splitlines() if '"GET /' in line]
    assert {r.split("?")[0].split()[1] for r in requested} >= {"/", "/static/dashboard.js", "/static/dashboard.css",
                                                               "/rollout/status", "/events"}
    static = "".join(p.read_text() for p in (ROOT / "workers" / "api" / "static").iterdir())
    assert "http://" not in static and "https://" not in static  # the page asks nothing of anyone but its server
