"""The SDK: `PolarClient(url)` submits batches of tasks to the rollout service, waits on them, reads their
trajectories back and holds the weight-sync fence. The URL picks the transport:

    from polar import PolarClient
    client = PolarClient("10.0.0.5:50051")          # HOST:PORT or http(s)://: `polar api`, token= or $POLAR_API_TOKEN
    client = PolarClient("redis://10.0.0.5:6379/1")  # a broker URL: its Redis and the batch folders directly
    batch = client.submit("tasks.yaml", group_size=4); batch.wait(timeout=600); df = batch.trajectories()
    client.pause(); <update the engine's weights>; client.resume()   # the weight-sync fence

This module owns the client and its HTTP transport, for a trainer that cannot reach the service's Redis or its
shared storage; the Redis transport is the rollout service's own code (workers/client.py), named in
REDIS_TRANSPORT and loaded on first use, so nothing here imports workers/.
Over HTTP, task files are read here and sent as JSON; their workspace/tests paths must be ones the service's nodes
see (relative ones are made absolute on this machine first, as the Redis transport would see them).
"""
from __future__ import annotations

import importlib
import os
import time
from pathlib import Path
from typing import Any, Callable, Protocol

import httpx

from polar.progress import Progress

TOKEN_ENV = "POLAR_API_TOKEN"
REDIS_TRANSPORT = "workers.client:RedisTransport"  # as polar/cli.py names the modules of its subcommands


class ApiError(RuntimeError):
    """The service refused or failed a request; the message is its own one line."""


def service_url(address: str) -> str:
    """`HOST:PORT` -> `http://HOST:PORT`; an http(s) URL as it is."""
    return (address if "://" in address else f"http://{address}").rstrip("/")


def over_http(url: str) -> bool:
    """Whether a client URL names `polar api` (HOST:PORT, http://, https://) rather than a broker (redis://,
    rediss://, redis+socket://)."""
    return "://" not in url or url.startswith(("http://", "https://"))


class Transport(Protocol):
    """How PolarClient reaches the service: HttpTransport (below) or RedisTransport (workers/client.py)."""

    def submit(self, tasks: str | Path, group_size: int, min_groups: int | None, adapter: str | None, out: Any,
               max_staleness: int | None, batch_id: str | None, sampling: dict[str, Any] | None, strategy: str,
               **options: Any) -> Any: ...

    def batch(self, batch_id: str) -> Any: ...

    def pause(self, timeout_s: float) -> None: ...

    def resume(self) -> None: ...

    def is_paused(self) -> bool: ...

    def nodes(self) -> list[Any]: ...

    def drain(self, node: str, deadline_s: float) -> None: ...

    def undrain(self, node: str) -> None: ...


class PolarClient:
    """The rollout service's client: one set of methods, whichever transport the URL picked (`transport`)."""

    def __init__(self, url: str, sessions: str | None = None, *, token: str | None = None, timeout_s: float = 60.0,
                 liveness_s: float = 30.0) -> None:
        """Over HTTP: `token` (else $POLAR_API_TOKEN), `timeout_s` per request. Over a broker: `sessions`, the
        sessions/fence Redis (default the broker's server, db 0); `liveness_s`, how long this client waits after
        connecting before it hands over what silent nodes held."""
        self.url = url
        self.transport: Transport
        if over_http(url):
            if sessions is not None:
                raise ValueError(f"PolarClient {url!r}: sessions= is for a redis:// broker URL (over HTTP the "
                                 f"service has its own); the API token goes in token=")
            self.transport = HttpTransport(url, token, timeout_s)
        else:
            if token is not None:
                raise ValueError(f"PolarClient {url!r}: token= is for `polar api` (HOST:PORT or http://); a broker "
                                 f"URL carries its own password")
            module, _, name = REDIS_TRANSPORT.partition(":")
            self.transport = getattr(importlib.import_module(module), name)(url, sessions, liveness_s)

    def submit(self, tasks: str | Path, group_size: int = 4, min_groups: int | None = None,
               adapter: str | None = None, out: str | Path = "runs/batches", max_staleness: int | None = None,
               batch_id: str | None = None, sampling: dict[str, Any] | None = None, strategy: str = "prefix_merge",
               **options: Any) -> Any:
        """Queue `group_size` samples of every task in the tasks file (YAML or JSONL, polar.tasks.load); returns
        the batch (wait(), progress(), trajectories(), results(), cancel()). `sampling`: some of temperature,
        top_p, top_k, max_tokens, seed, used for every LLM call of the batch (polar_mitm/sessions/sampling.py).
        `strategy`: prefix_merge (one row per append-only chain) or per_request (one row per LLM call).
        Over a broker, `options` may hold tasks_root=, run_offline=, task_ids= (workers/client.py); over HTTP,
        callback_url= (docs/api.md), and `out` and `batch_id` are the service's to choose."""
        return self.transport.submit(tasks, group_size, min_groups, adapter, out, max_staleness, batch_id, sampling,
                                     strategy, **options)

    def batch(self, batch_id: str) -> Any:
        return self.transport.batch(batch_id)

    def get_trajectories(self, batch_id: str):
        """A batch's trajectories as a pandas DataFrame."""
        return self.batch(batch_id).trajectories()

    def pause(self, timeout_s: float = 120.0) -> None:
        """Every node's proxy holds new LLM calls; returns once in-flight calls have drained."""
        self.transport.pause(timeout_s)

    def resume(self) -> None:
        self.transport.resume()

    def is_paused(self) -> bool:
        return self.transport.is_paused()

    def nodes(self) -> list[Any]:
        """Every node that ever beat: alive, draining, stopped or lost (over a broker)."""
        return self.transport.nodes()

    def drain(self, node: str, deadline_s: float = 300.0) -> None:
        """The node takes no new samples; what still runs there `deadline_s` from now is handed over."""
        self.transport.drain(node, deadline_s)

    def undrain(self, node: str) -> None:
        self.transport.undrain(node)


class HttpTransport:
    """PolarClient over `polar api` / `python -m polar.rollout_server`: each call one request, bearer token."""

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
               batch_id: Any = None, sampling: dict[str, Any] | None = None, strategy: str = "prefix_merge",
               callback_url: str | None = None) -> "HttpBatch":
        """`out` and `batch_id` are the service's to choose and are ignored; `callback_url` gets the batch's
        signed callbacks (docs/api.md)."""
        from polar.tasks.load import load_tasks

        path = Path(tasks)
        specs = load_tasks(path)
        names = {adapter} if adapter else {t.adapter for t in specs}
        if len(names) != 1 or None in names:
            raise ValueError(f"{tasks}: over HTTP one batch has one harness: give adapter= (tasks name {names})")
        body = {"harness": names.pop(), "group_size": group_size, "min_groups": min_groups,
                "max_staleness": max_staleness, "sampling": sampling, "callback_url": callback_url,
                "trajectory_strategy": strategy}
        if path.is_dir():  # a Harbor folder: the service reads it from the shared storage (under its tasks root)
            body["harbor"] = str(path.resolve())
        else:
            body["tasks"] = [_task_fields(t) for t in specs]
        data = self.request("POST", "/api/tasks", json={k: v for k, v in body.items() if v is not None}).json()
        return HttpBatch(self, data["batch_id"], data.get("secret"))

    def batch(self, batch_id: str) -> "HttpBatch":
        self.request("GET", f"/api/batches/{batch_id}")
        return HttpBatch(self, batch_id)

    def pause(self, timeout_s: float = 120.0) -> None:
        self.request("POST", "/policy/pause", json={"timeout_s": timeout_s}, timeout=timeout_s + 30)

    def resume(self) -> None:
        self.request("POST", "/policy/resume")

    def is_paused(self) -> bool:
        return bool(self.request("GET", "/policy").json()["paused"])

    def status(self) -> dict[str, Any]:
        """The service's overview (GET /rollout/status): batches, the fence, each node's state and load."""
        return self.request("GET", "/rollout/status").json()

    def nodes(self) -> list[Any]:
        raise NotImplementedError(f"{self.url}: `polar api` lists its nodes in transport.status() (/rollout/status);"
                                  f" a redis:// broker URL gives node objects")

    def drain(self, node: str, deadline_s: float) -> None:
        raise NotImplementedError(f"{self.url}: `polar api` drains no node; use a redis:// broker URL "
                                  f"(or `polar node drain`)")

    def undrain(self, node: str) -> None:
        raise NotImplementedError(f"{self.url}: `polar api` drains no node; use a redis:// broker URL "
                                  f"(or `polar node undrain`)")


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
    def __init__(self, transport: HttpTransport, batch_id: str, secret: str | None = None) -> None:
        self.transport, self.batch_id, self.secret = transport, batch_id, secret

    def status(self) -> dict[str, Any]:
        return self.transport.request("GET", f"/api/batches/{self.batch_id}").json()

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
        return bool(self.transport.request("POST", f"/api/batches/{self.batch_id}/cancel").json()["cancelled"])

    def samples(self) -> dict[str, dict[str, Any]]:
        return self.status()["samples"]

    def results(self) -> list[dict[str, Any]]:
        return self.transport.request("GET", f"/api/batches/{self.batch_id}/results").json()

    def trajectories(self):
        """The finished groups' trajectories as a pandas DataFrame (the Parquet download, read in memory)."""
        return read_parquet(self.transport.request("GET", f"/api/batches/{self.batch_id}/trajectories.parquet").content)


def read_parquet(data: bytes):
    """Parquet bytes as a DataFrame, read on this thread. `pq.read_table` goes through Arrow's dataset scanner,
    which starts a native thread even with use_threads=False; one still alive at interpreter exit ended a script
    that had printed its result with `terminate called without an active exception` (exit 134; 1 run in 200
    here, 5 in 200 with a BufferReader; apache/arrow#34314). ParquetFile.read starts none."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pq.ParquetFile(pa.BufferReader(data), pre_buffer=False).read(use_threads=False)
    return table.to_pandas(use_threads=False)
