"""The SDK over HTTP: `PolarClient("HOST:PORT")` (or `http(s)://HOST:PORT`; token= or $POLAR_API_TOKEN) against
`polar api` / `python -m polar.rollout_server`, with the Redis client's methods (workers/client.py hands its http
URLs here), for a trainer that cannot reach the service's Redis or its shared storage. It imports nothing of
workers/: `from polar import PolarClient` is this class.

    from polar import PolarClient
    client = PolarClient("10.0.0.5:50051")                   # the token from $POLAR_API_TOKEN
    batch = client.submit("tasks.yaml", group_size=4); batch.wait(timeout=600); df = batch.trajectories()
    df = client.get_trajectories(batch.batch_id)

Task files are read here and sent as JSON; their workspace/tests paths must be ones the service's nodes see
(relative ones are made absolute on this machine first, as the Redis client would see them).
"""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Callable

import httpx

from polar.progress import Progress

TOKEN_ENV = "POLAR_API_TOKEN"


class ApiError(RuntimeError):
    """The service refused or failed a request; the message is its own one line."""


def service_url(address: str) -> str:
    """`HOST:PORT` -> `http://HOST:PORT`; an http(s) URL as it is; anything else (redis://) is refused."""
    if "://" not in address:
        return f"http://{address}".rstrip("/")
    if not address.startswith(("http://", "https://")):
        raise ValueError(f"PolarClient {address!r}: expected HOST:PORT or http(s)://HOST:PORT of the rollout "
                         f"server (a redis:// broker: workers.client.PolarClient)")
    return address.rstrip("/")


class PolarClient:
    def __init__(self, url: str, token: str | None = None, timeout_s: float = 60.0) -> None:
        token = token or os.environ.get(TOKEN_ENV)
        if not token:
            raise ValueError(f"PolarClient over HTTP needs token= (or ${TOKEN_ENV}): the rollout server's token")
        self.url = service_url(url)
        self.http = httpx.Client(base_url=self.url, headers={"authorization": f"Bearer {token}"},
                                 timeout=timeout_s)

    def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        answer = self.http.request(method, path, **kwargs)
        if answer.status_code >= 400:
            try:
                message = answer.json().get("error") or answer.json().get("detail")
            except ValueError:
                message = answer.text[:300]
            raise ApiError(f"{method} {path}: HTTP {answer.status_code}: {message}")
        return answer

    def submit(self, tasks: str | Path, group_size: int = 4, min_groups: int | None = None,
               adapter: str | None = None, out: Any = None, max_staleness: int | None = None,
               batch_id: Any = None, sampling: dict[str, Any] | None = None,
               callback_url: str | None = None, strategy: str = "prefix_merge") -> "HttpBatch":
        """As the Redis client's submit (same argument order); `out` and `batch_id` are the service's to choose
        and are ignored; `callback_url` gets the batch's signed callbacks (docs/api.md)."""
        from polar.tasks.load import load_tasks

        specs = load_tasks(Path(tasks))
        names = {adapter} if adapter else {t.adapter for t in specs}
        if len(names) != 1 or None in names:
            raise ValueError(f"{tasks}: over HTTP one batch has one harness: give adapter= (tasks name {names})")
        body = {"harness": names.pop(), "group_size": group_size, "min_groups": min_groups,
                "max_staleness": max_staleness, "sampling": sampling, "callback_url": callback_url,
                "trajectory_strategy": strategy,
                "tasks": [_task_fields(t) for t in specs]}
        data = self.request("POST", "/api/tasks", json={k: v for k, v in body.items() if v is not None}).json()
        return HttpBatch(self, data["batch_id"], data.get("secret"))

    def batch(self, batch_id: str) -> "HttpBatch":
        self.request("GET", f"/api/batches/{batch_id}")
        return HttpBatch(self, batch_id)

    def get_trajectories(self, batch_id: str):
        return HttpBatch(self, batch_id).trajectories()

    def pause(self, timeout_s: float = 120.0) -> None:
        self.request("POST", "/policy/pause", json={"timeout_s": timeout_s}, timeout=timeout_s + 30)

    def resume(self) -> None:
        self.request("POST", "/policy/resume")

    def is_paused(self) -> bool:
        return bool(self.request("GET", "/policy").json()["paused"])

    def status(self) -> dict[str, Any]:
        return self.request("GET", "/rollout/status").json()


def _task_fields(spec: Any) -> dict[str, Any]:
    entry = {"task_id": spec.task_id, "instruction": spec.instruction, "evaluator": _evaluator(spec.evaluator),
             "image": spec.image, "timeout_s": spec.timeout_s, "session_timeout_s": spec.session_timeout_s,
             "metadata": dict(spec.metadata) or None, "protected": list(spec.protected) or None,
             "submit": spec.submit.to_dict() if spec.submit else None,
             "reward_range": list(spec.reward_range), "max_calls": spec.max_calls}
    for k in ("workspace", "tests"):
        if getattr(spec, k) is not None:
            entry[k] = str(Path(getattr(spec, k)).resolve())
    return {k: v for k, v in entry.items() if v is not None}


def _evaluator(ev: Any) -> dict[str, Any]:
    """An EvaluatorSpec back in the task file's form (the kind is the key that is set)."""
    out: dict[str, Any] = {"timeout_s": ev.timeout_s}
    if ev.kind == "command":
        out.update(command=ev.command, reward=ev.reward)
        if ev.reward == "file":
            out["reward_file"] = ev.reward_file
    elif ev.kind == "files":
        out["files"] = dict(ev.files)
    elif ev.kind == "pytest":
        out["pytest"] = list(ev.pytest)
    else:
        out["python"] = ev.python
    return out


class HttpBatch:
    def __init__(self, client: PolarClient, batch_id: str, secret: str | None = None) -> None:
        self.client, self.batch_id, self.secret = client, batch_id, secret

    def status(self) -> dict[str, Any]:
        return self.client.request("GET", f"/api/batches/{self.batch_id}").json()

    def progress(self) -> Progress:
        return Progress(**self.status()["progress"])

    def wait(self, timeout: float | None = None, poll_s: float = 0.5,
             on_progress: Callable[[Progress], None] | None = None) -> Progress:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            data = self.status()
            p = Progress(**data["progress"])
            if on_progress is not None:
                on_progress(p)
            if data["settled"]:
                return p
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"batch {self.batch_id} not finished after {timeout}s: {p.line()}")
            time.sleep(poll_s)

    def cancel(self) -> bool:
        return bool(self.client.request("POST", f"/api/batches/{self.batch_id}/cancel").json()["cancelled"])

    def samples(self) -> dict[str, dict[str, Any]]:
        return self.status()["samples"]

    def results(self) -> list[dict[str, Any]]:
        return self.client.request("GET", f"/api/batches/{self.batch_id}/results").json()

    def trajectories(self):
        """The finished groups' trajectories as a pandas DataFrame (the Parquet download, read in memory)."""
        return read_parquet(self.client.request("GET", f"/api/batches/{self.batch_id}/trajectories.parquet").content)


def read_parquet(data: bytes):
    """Parquet bytes as a DataFrame, read on this thread. `pq.read_table` goes through Arrow's dataset scanner,
    which starts a native thread even with use_threads=False; one still alive at interpreter exit ended a script
    that had printed its result with `terminate called without an active exception` (exit 134; 1 run in 200
    here, 5 in 200 with a BufferReader; apache/arrow#34314). ParquetFile.read starts none."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pq.ParquetFile(pa.BufferReader(data), pre_buffer=False).read(use_threads=False)
    return table.to_pandas(use_threads=False)


HttpClient = PolarClient  # the name workers/ has used
