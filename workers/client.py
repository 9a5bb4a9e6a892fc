"""PolarClient's Redis transport (polar/client.py picks it for a broker URL): batches go straight to the rollout
workers (`celery -A workers worker`) through the broker, and come back as one trajectory table.

    client = PolarClient("redis://127.0.0.1:6379/1")        # from polar import PolarClient
    batch = client.submit("fixtures/tasks/demo.yaml", group_size=4, min_groups=None, out="runs/batches")
    batch.wait(timeout=600); df = batch.trajectories()      # rewards, advantages, weights per row
    client.pause(); <update the engine's weights>; client.resume()   # the weight-sync fence

`polar submit|status|node|policy` and `polar api` use the transport itself. The batch folder (`out/<batch_id>`, on
storage every node sees) holds the manifest, the samples and `trajectories/`, one Parquet part per finished group.
"""
from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import redis

from workers import batches, liveness, steps
from workers.manifest import Manifest, new_batch_id, plan, read_manifest, write_manifest
from workers.settings import DEFAULT_BROKER, PUBLISH_RETRY, sessions_url


class RedisTransport:
    """The broker, the batches' state in Redis and the fence's sessions Redis, as PolarClient's transport."""

    def __init__(self, broker: str = DEFAULT_BROKER, sessions: str | None = None, liveness_s: float = 30.0) -> None:
        from celery import Celery

        self.broker = broker
        self.sessions = sessions or sessions_url(broker)
        self.redis = batches.connect(broker)
        self.app = Celery("polar-client", broker=broker, set_as_current=False)
        self.app.conf.update(task_serializer="json", accept_content=["json"], task_ignore_result=True,
                             task_publish_retry_policy=PUBLISH_RETRY)
        self.messages = steps.Messages(self.app)
        self.liveness_s = liveness_s
        self.connected_since: float | None = None

    def nodes(self) -> list[liveness.NodeStatus]:
        """Every node that ever beat: alive, draining, stopped or lost."""
        return liveness.nodes(self.redis)

    def drain(self, node: str, deadline_s: float = 300.0) -> None:
        """The node takes no new samples; what still runs there `deadline_s` from now is handed over."""
        liveness.drain(self.redis, node, deadline_s)

    def undrain(self, node: str) -> None:
        liveness.undrain(self.redis, node)

    def reap(self) -> list[str]:
        """Reassign what lost nodes held (nodes do this too; whoever comes first), once this client has been
        connected for a liveness timeout; returns the samples reassigned."""
        now = time.monotonic()
        try:
            self.connected_since = self.connected_since or now
            if now - self.connected_since < self.liveness_s:
                self.redis.ping()
                return []
            return steps.reap(self.redis, self.messages.enqueue)
        except redis.RedisError:
            self.connected_since = None
            return []

    def submit(self, tasks: str | Path, group_size: int = 4, min_groups: int | None = None,
               adapter: str | None = None, out: str | Path = "runs/batches", max_staleness: int | None = None,
               batch_id: str | None = None, sampling: dict[str, Any] | None = None,
               strategy: str = "prefix_merge", tasks_root: str | Path | None = None,
               run_offline: bool = False, task_ids: Sequence[str] | None = None) -> "Batch":
        """Queue `group_size` samples of every task in the tasks file (YAML or JSONL, polar.tasks.load).
        `sampling`: some of temperature, top_p, top_k, max_tokens, seed, used for every LLM call of the batch
        whatever the agent's requests ask for (polar_mitm/sessions/sampling.py). `strategy`: prefix_merge (one row per
        append-only chain) or per_request (one row per LLM call). `tasks_root`: where the tasks' paths may lead
        (polar/tasks/roots.py; recorded in the manifest, so every node holds the batch to it). `run_offline`: the
        verifiers of tasks that ask for the internet run without it too (otherwise each node gives them its egress
        proxy, POLAR_VERIFIER_HOSTS; agents never get it). `task_ids`: only these
        tasks of the file, in this order (a trainer's step; KeyError naming an id the file does not hold)."""
        from polar.harness.adapters import load_adapter
        from polar.tasks.roots import tasks_roots
        from polar.tasks.load import load_tasks

        tasks_file = Path(tasks).resolve()
        roots = tasks_roots(tasks_file, tasks_root)
        specs = load_tasks(tasks_file, roots)
        if task_ids is not None:
            by_id = {t.task_id: t for t in specs}
            if missing := [t for t in task_ids if t not in by_id]:
                raise KeyError(f"{tasks_file}: no task {', '.join(map(repr, missing))}")
            specs = [by_id[t] for t in task_ids]
        for name in {adapter} if adapter else {t.adapter for t in specs}:
            if not name:
                raise ValueError(f"{tasks_file}: a task names no adapter; give one with adapter=/--adapter")
            load_adapter(name)
        bid = batch_id or new_batch_id()
        manifest = plan(bid, Path(out).resolve() / bid, tasks_file, [t.task_id for t in specs], group_size,
                        adapter, min_groups, max_staleness, sampling, strategy)
        manifest = dataclasses.replace(manifest, tasks_roots=tuple(str(r) for r in roots), run_offline=run_offline)
        path = str(write_manifest(manifest))
        batches.create(self.redis, bid, path, [s.sample_id for s in manifest.samples], group_size,
                       len(manifest.groups), min_groups)
        for s in manifest.samples:
            steps.submit_sample(self.messages.enqueue, self.redis, manifest, path, s.sample_id)
        return Batch(self, manifest)

    def batch(self, batch_id: str) -> "Batch":
        return Batch(self, read_manifest(batches.info(self.redis, batch_id)["manifest"]))

    def pause(self, timeout_s: float = 120.0) -> None:
        """Every node's proxy holds new LLM calls; returns once in-flight calls have drained."""
        from polar_mitm.gate.fence import pause

        pause(self.sessions, timeout_s=timeout_s)

    def resume(self) -> None:
        from polar_mitm.gate.fence import resume

        resume(self.sessions)

    def is_paused(self) -> bool:
        from polar_mitm.gate.fence import is_paused

        return is_paused(self.sessions)


class Batch:
    def __init__(self, transport: RedisTransport, manifest: Manifest) -> None:
        self.transport, self.manifest = transport, manifest

    @property
    def batch_id(self) -> str:
        return self.manifest.batch_id

    @property
    def dir(self) -> Path:
        return self.manifest.batch_dir

    def progress(self) -> batches.Progress:
        return batches.progress(self.transport.redis, self.batch_id)

    def settled(self, p: batches.Progress) -> bool:
        """Finished, and no sample is still cleaning up."""
        return p.finished and p.running == 0

    def wait(self, timeout: float | None = None, poll_s: float = 0.5,
             on_progress: Callable[[batches.Progress], None] | None = None) -> batches.Progress:
        """Block until the batch is completed or cancelled and every sample has settled; TimeoutError after
        `timeout` seconds. `on_progress` sees each poll's progress (polar submit --wait draws its bar with it).
        Each poll also reassigns what lost nodes held, so a batch finishes without them."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            self.transport.reap()
            p = self.progress()
            if on_progress is not None:
                on_progress(p)
            if self.settled(p):
                return p
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"batch {self.batch_id} not finished after {timeout}s: {p.line()}")
            time.sleep(poll_s)

    def cancel(self) -> bool:
        """Queued samples never start; running ones stop and their sandboxes go. False if already finished."""
        return steps.stop_batch(self.transport.redis, self.transport.messages.revoke, self.batch_id)

    def samples(self) -> dict[str, dict[str, Any]]:
        return batches.samples(self.transport.redis, self.batch_id)

    def results(self) -> list[dict[str, Any]]:
        """The SampleResults of the samples that finished (done or masked)."""
        found = []
        for s in self.manifest.samples:
            path = self.dir / "samples" / s.sample_id / "result.json"
            if path.exists():
                found.append(json.loads(path.read_text()))
        return found

    def trajectories(self):
        """The finished groups' trajectories, with rewards, advantages and weights, as a pandas DataFrame."""
        from polar_traj import read

        folder = self.dir / "trajectories"
        if not folder.is_dir():
            from polar_traj.schema import TRAJECTORY_SCHEMA

            return TRAJECTORY_SCHEMA.empty_table().to_pandas()
        return read(folder).to_pandas()
