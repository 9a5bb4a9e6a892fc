"""Callbacks: each finished sample, and each finished group with its advantages, POSTed as JSON to the batch's
`callback_url`, signed, retried with backoff; a callback that keeps failing is recorded in the batch's status
and never holds the batch up.

Where it runs: in `polar api`, a thread reading the event stream (workers/events.py) as one consumer of the Redis
consumer group `polar-api`, so that behind a load balancer each event is handled by one server. Deliveries run
on a small thread pool beside it, so a slow trainer delays nobody else. Events that arrive while no `polar api`
runs wait in the stream (up to events.MAXLEN) and are delivered when one starts.

Signature: header `X-Polar-Signature: sha256=<hex HMAC-SHA256 of the raw body, keyed with the batch's secret>`
(the secret is in the submit response); `X-Polar-Event: sample|group`; `X-Polar-Delivery: <event id>`.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import redis

from workers import batches, events
from workers.manifest import read_manifest, result_path

GROUP = "polar-api"
API_PREFIX = "polar:api:batch:"
COUNTERS = "polar:api:counters"  # calls, prompt_tokens, response_tokens, samples_finished, callbacks_*
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RetryPolicy:
    attempts: int = 5
    base_s: float = 0.5  # waits 0.5, 1, 2, 4 s between attempts
    cap_s: float = 30.0
    timeout_s: float = 10.0


def sign(secret: str, body: bytes) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def verify(secret: str, body: bytes, signature: str | None) -> bool:
    """What a trainer does with a callback: recompute the HMAC of the raw body and compare in constant time."""
    return bool(signature) and hmac.compare_digest(sign(secret, body), signature)


def batch_meta(r: redis.Redis, batch_id: str) -> dict[str, str]:
    return {k.decode(): v.decode() for k, v in r.hgetall(API_PREFIX + batch_id).items()}


def callback_status(r: redis.Redis, batch_id: str) -> dict[str, Any]:
    raw = {k.decode(): v.decode() for k, v in r.hgetall(API_PREFIX + batch_id + ":callbacks").items()}
    return {"delivered": int(raw.get("delivered", 0)), "failed": int(raw.get("failed", 0)),
            "last_error": raw.get("last_error")}


def deliver(client: httpx.Client, url: str, secret: str, kind: str, delivery: str, payload: dict[str, Any],
            policy: RetryPolicy) -> str | None:
    """POST the payload until a 2xx answer; None when delivered, else the last failure."""
    body = json.dumps(payload, sort_keys=True).encode()
    headers = {"content-type": "application/json", "x-polar-signature": sign(secret, body),
               "x-polar-event": kind, "x-polar-delivery": delivery}
    error = "no attempt"
    for attempt in range(policy.attempts):
        if attempt:
            time.sleep(min(policy.cap_s, policy.base_s * 2 ** (attempt - 1)))
        try:
            answer = client.post(url, content=body, headers=headers, timeout=policy.timeout_s)
            if 200 <= answer.status_code < 300:
                return None
            error = f"HTTP {answer.status_code}"
        except httpx.HTTPError as e:
            error = f"{type(e).__name__}: {e}"
    return f"{kind} {payload.get('sample_id') or payload.get('group_id')}: {error} after {policy.attempts} attempts"


def sample_payload(batch_dir: Path, batch_id: str, sample_id: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The callback body of a finished sample, and its result (for the counters)."""
    manifest = read_manifest(batch_dir / "batch.json")
    res = json.loads(result_path(manifest, sample_id).read_text())
    keep = ("sample_id", "task_id", "group_id", "status", "failure", "reason", "reward", "weight", "node",
            "calls", "attempts", "timings")
    return {"event": "sample", "batch_id": batch_id, **{k: res.get(k) for k in keep}}, res


def group_payload(batch_dir: Path, batch_id: str, group_id: str) -> dict[str, Any]:
    import pyarrow.parquet as pq

    meta = pq.read_metadata(batch_dir / "trajectories" / f"{group_id}.parquet").metadata or {}
    group = json.loads(meta.get(b"polar.group", b"{}"))
    manifest = read_manifest(batch_dir / "batch.json")
    rewards = {}
    for s in manifest.group(group_id):
        path = result_path(manifest, s.sample_id)
        rewards[s.sample_id] = json.loads(path.read_text()).get("reward") if path.exists() else None
    return {"event": "group", "batch_id": batch_id, "group_id": group_id,
            "task_id": manifest.group(group_id)[0].task_id, "samples": group.get("samples", []),
            "advantages": group.get("advantages", {}), "rewards": rewards}


def _tokens(result: dict[str, Any]) -> tuple[int, int]:
    part = result.get("trajectories")
    if not part or not Path(part).exists():
        return 0, 0
    import pyarrow.compute as pc
    from polar_traj import read

    table = read(part, columns=["prompt_len", "response_len"])
    return int(pc.sum(table["prompt_len"]).as_py() or 0), int(pc.sum(table["response_len"]).as_py() or 0)


class Finisher:
    """The thread that turns finished samples and groups into callbacks and counters."""

    def __init__(self, r: redis.Redis, consumer: str, policy: RetryPolicy = RetryPolicy(), workers: int = 4) -> None:
        self.r, self.consumer, self.policy = r, consumer, policy
        self.pool = ThreadPoolExecutor(workers, thread_name_prefix="polar-callback")
        self.http = httpx.Client()
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="polar-finisher", daemon=True)

    def start(self) -> None:
        try:
            self.r.xgroup_create(events.STREAM, GROUP, id="$", mkstream=True)
        except redis.ResponseError as e:
            if "BUSYGROUP" not in str(e):
                raise
        self.thread.start()

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(5)
        self.pool.shutdown(wait=False, cancel_futures=True)

    def _loop(self) -> None:
        while not self.stopping.is_set():
            try:
                found = self.r.xreadgroup(GROUP, self.consumer, {events.STREAM: ">"}, count=100, block=500)
            except redis.RedisError as e:
                log.warning("polar api: reading events: %s", e)
                self.stopping.wait(1.0)
                continue
            for ev in events.parse(found[0][1]) if found else []:
                try:
                    self.handle(ev)
                except Exception as e:  # one odd event (a folder gone, a part unreadable) must not stop the rest
                    log.warning("polar api: event %s: %s: %s", ev.id, type(e).__name__, e)
                self.r.xack(events.STREAM, GROUP, ev.id)

    def handle(self, ev: events.Event) -> None:
        batch_id = ev.data.get("batch_id")
        if ev.kind == "sample" and ev.data.get("stage") in ("done", "masked"):
            batch_dir = Path(batches.info(self.r, batch_id)["manifest"]).parent
            payload, result = sample_payload(batch_dir, batch_id, ev.data["sample_id"])
            prompt, response = _tokens(result)
            pipe = self.r.pipeline()
            for name, n in (("samples_finished", 1), ("calls", int(result.get("calls") or 0)),
                            ("prompt_tokens", prompt), ("response_tokens", response)):
                pipe.hincrby(COUNTERS, name, n)
            pipe.execute()
            self._send(batch_id, "sample", ev.id, payload)
        elif ev.kind == "group":
            batch_dir = Path(batches.info(self.r, batch_id)["manifest"]).parent
            self._send(batch_id, "group", ev.id, group_payload(batch_dir, batch_id, ev.data["group_id"]))

    def _send(self, batch_id: str, kind: str, delivery: str, payload: dict[str, Any]) -> None:
        meta = batch_meta(self.r, batch_id)
        if meta.get("callback_url"):
            self.pool.submit(self._deliver, batch_id, meta["callback_url"], meta["secret"], kind, delivery, payload)

    def _deliver(self, batch_id: str, url: str, secret: str, kind: str, delivery: str,
                 payload: dict[str, Any]) -> None:
        error = deliver(self.http, url, secret, kind, delivery, payload, self.policy)
        k = API_PREFIX + batch_id + ":callbacks"
        pipe = self.r.pipeline()
        pipe.hincrby(k, "failed" if error else "delivered", 1)
        pipe.hincrby(COUNTERS, "callbacks_failed" if error else "callbacks_delivered", 1)
        if error:
            pipe.hset(k, "last_error", error)
            log.warning("polar api: callback of batch %s to %s failed: %s", batch_id, url, error)
        pipe.expire(k, batches.TTL_S)
        pipe.execute()
