"""What `polar api`'s routes do, as plain methods over the Redis transport (workers/client.py) and the batches'
folders on shared storage; the routes (workers/api/app.py) only parse and answer."""
from __future__ import annotations

import json
import secrets
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from workers import batches, events
from workers.api.callback_policy import CallbackPolicy, CallbackRefused
from workers.api.callbacks import API_PREFIX, batch_meta, callback_status
from workers.api.models import BadRequest, Submission
from workers.client import RedisTransport
from workers.manifest import new_batch_id, read_manifest, result_path


@dataclass(frozen=True)
class ApiConfig:
    broker: str
    out: Path  # where batch folders go: storage every node sees
    token: str
    tasks_root: Path  # relative workspace/tests paths in a body are under it
    sessions: str | None = None
    host: str = "127.0.0.1"
    port: int = 50051
    max_body: int = 1 << 20
    max_samples: int = 4096  # per batch
    heartbeat_s: float = 15.0
    list_limit: int = 50  # batches in /rollout/status and the dashboard
    callback_hosts: tuple[str, ...] = ()  # beside loopback (callback_policy.py)
    max_streams: int = 256  # open /events streams per process (429 beyond)


class NotFound(KeyError):
    pass


class Service:
    def __init__(self, config: ApiConfig) -> None:
        self.config = config
        self.client = RedisTransport(config.broker, config.sessions)
        self.r = self.client.redis
        self.callbacks = CallbackPolicy.of(config.callback_hosts)

    def submit(self, sub: Submission) -> dict[str, Any]:
        if sub.samples > self.config.max_samples:
            raise BadRequest(sub.size_field, f"{sub.samples} samples in one batch; this service takes at most "
                                             f"{self.config.max_samples} (polar api --max-samples)")
        if sub.callback_url:
            try:
                self.callbacks.check(sub.callback_url)
            except CallbackRefused as e:
                raise BadRequest("callback_url", str(e)) from e
        batch_id = new_batch_id()
        folder = self.config.out / batch_id
        folder.mkdir(parents=True)
        if sub.folder is not None:  # a Harbor folder, as polar submit takes it
            tasks_file = sub.folder
        else:
            tasks_file = folder / "tasks.jsonl"
            tasks_file.write_text("".join(json.dumps(t) + "\n" for t in sub.tasks))
        secret = secrets.token_hex(32)
        # Before the batch exists, so the finisher knows where to call back whenever its first sample ends.
        self.r.hset(API_PREFIX + batch_id, mapping={"secret": secret, "callback_url": sub.callback_url or "",
                                                    "extra": json.dumps(sub.extra)})
        self.r.expire(API_PREFIX + batch_id, batches.TTL_S)
        try:
            self.client.submit(tasks_file, sub.group_size, sub.min_groups, sub.adapter, self.config.out,
                               sub.max_staleness, batch_id, sub.sampling, sub.strategy, self.config.tasks_root)
        except ValueError as e:  # nothing was queued: leave nothing behind
            self.r.delete(API_PREFIX + batch_id)
            if sub.folder is None:
                tasks_file.unlink()
            if not any(folder.iterdir()):
                folder.rmdir()
            raise BadRequest(_field_of(str(e)), _problem_of(str(e))) from e
        return {"id": batch_id, "batch_id": batch_id, "samples": sub.samples, "secret": secret,
                "status": batches.RUNNING}

    def _manifest(self, batch_id: str):
        try:
            return read_manifest(batches.info(self.r, batch_id)["manifest"])
        except KeyError as e:
            raise NotFound(batch_id) from e

    def status(self, batch_id: str) -> dict[str, Any]:
        manifest = self._manifest(batch_id)
        p = batches.progress(self.r, batch_id)
        meta = batch_meta(self.r, batch_id)
        settled = p.finished and p.running == 0
        return printable({"id": batch_id, "batch_id": batch_id, "status": p.status, "settled": settled,
                "progress": p.to_dict(), "line": p.line(), "adapter": manifest.adapter,
                "tasks": sorted({s.task_id for s in manifest.samples}), "group_size": manifest.group_size,
                "samples": batches.samples(self.r, batch_id), "callback_url": meta.get("callback_url") or None,
                "callbacks": callback_status(self.r, batch_id), "extra": json.loads(meta.get("extra") or "{}")})

    def results(self, batch_id: str) -> list[dict[str, Any]]:
        manifest = self._manifest(batch_id)
        found = []
        for s in manifest.samples:
            path = result_path(manifest, s.sample_id)
            if path.exists():
                try:
                    found.append(json.loads(path.read_text()))
                except (OSError, ValueError) as e:  # one unreadable result does not hide the others
                    found.append({"sample_id": s.sample_id, "error": f"result.json unreadable: {e}"})
        return printable(found)  # an agent's file name that is not UTF-8 comes back escaped

    def cancel(self, batch_id: str) -> bool:
        self._manifest(batch_id)
        return self.client.batch(batch_id).cancel()

    def overview(self) -> dict[str, Any]:
        after = events.last_id(self.r)  # read first: /events?after= then misses nothing this snapshot lacks
        ids = batches.batch_ids(self.r)[: self.config.list_limit]
        listed = []
        for b in ids:
            try:
                p = batches.progress(self.r, b)
            except KeyError:  # expired between the scan and the read
                continue
            meta = batches.info(self.r, b)
            listed.append({"batch_id": b, "progress": p.to_dict(), "line": p.line(),
                           "created": float(meta.get("created", 0))})
        return {"batches": listed, "events_after": after, "fence": {"paused": self.client.is_paused()},
                "nodes": [{"node": n.node, "state": n.state, "load": n.load, "beat_at": n.beat_at}
                          for n in self.client.nodes()]}

    def pulse(self) -> dict[str, Any]:
        """What an SSE heartbeat carries: the fence, the nodes, the finisher's counters, and the mean
        queued-to-finished time of the newest batches' finished samples."""
        from workers.api.callbacks import COUNTERS

        spans = []
        for b in batches.batch_ids(self.r)[:5]:
            for st in batches.samples(self.r, b).values():
                end = st.get("t_done") or st.get("t_masked")
                if end and st.get("t_queued"):
                    spans.append(end - st["t_queued"])
        counters = {k.decode(): int(v) for k, v in self.r.hgetall(COUNTERS).items()}
        return {"time": time.time(), "fence": {"paused": self.client.is_paused()},
                "nodes": [{"node": n.node, "state": n.state, "load": n.load} for n in self.client.nodes()],
                "counters": counters, "sample_latency_s": sum(spans) / len(spans) if spans else None}

    def pause(self, timeout_s: float) -> None:
        self.client.pause(timeout_s)
        events.emit(self.r, "fence", paused=True)

    def resume(self) -> None:
        self.client.resume()
        events.emit(self.r, "fence", paused=False)

    def trajectories_folder(self, batch_id: str) -> Path:
        return self._manifest(batch_id).batch_dir / "trajectories"

    def trajectory_rows(self, batch_id: str) -> list[dict[str, Any]]:
        from polar_traj import read

        folder = self.trajectories_folder(batch_id)
        return read(folder).to_pylist() if folder.is_dir() else []

    def parquet_file(self, batch_id: str) -> Path:
        """The batch's finished groups as one Parquet file (a temp file the caller deletes): part by part, so
        a big batch is never all in memory."""
        import pyarrow.parquet as pq

        from polar_traj.parquet import part_files
        from polar_traj.schema import TRAJECTORY_SCHEMA

        folder = self.trajectories_folder(batch_id)
        fd, name = tempfile.mkstemp(prefix=f"polar-{batch_id}-", suffix=".parquet")
        path = Path(name)
        with open(fd, "wb") as out, pq.ParquetWriter(out, TRAJECTORY_SCHEMA) as writer:
            for part in part_files(folder) if folder.is_dir() else []:
                writer.write_table(pq.read_table(part).cast(TRAJECTORY_SCHEMA))
        return path


def printable(value: Any) -> Any:
    """`value` with each lone surrogate (a name that is not UTF-8, kept by surrogateescape) as a backslash
    escape, so that it encodes as UTF-8 (polar/run/sample.py writes results the same way)."""
    from polar.run.sample import printable as escape

    return escape(value)


def file_chunks(path: Path, size: int = 1 << 16) -> Iterator[bytes]:
    try:
        with open(path, "rb") as f:
            while chunk := f.read(size):
                yield chunk
    finally:
        path.unlink(missing_ok=True)


def _field_of(message: str) -> str:
    """The field a task-file error names ("FILE:LINE: FIELD: problem" or "FIELD …: problem")."""
    parts = message.split(": ")
    if len(parts) >= 3 and ":" in parts[0]:
        return parts[1]
    return parts[0].split()[0] if parts else "body"


def _problem_of(message: str) -> str:
    parts = message.split(": ")
    if len(parts) >= 3 and ":" in parts[0]:
        return ": ".join(parts[2:])
    return message
