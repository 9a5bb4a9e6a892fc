"""Callbacks: each finished sample, and each finished group with its advantages, POSTed as JSON to the batch's
`callback_url`, signed, retried with backoff; every delivery that fails is recorded in the batch's status and
as a `callback` event, and never holds the batch up.

Where it runs: in `polar api`, a thread reading the event stream (workers/events.py) as one consumer of the Redis
consumer group `polar-api`, so that behind a load balancer each event is handled by one server. Deliveries run
on a small thread pool beside it, so a slow trainer delays nobody else. Events that arrive while no `polar api`
runs wait in the stream (up to events.MAXLEN) and are delivered when one starts. Each delivery goes only where
the callback policy allows (callback_policy.py), to the address it resolved, and follows no redirect.

Signature: `X-Polar-Timestamp: <unix seconds>`, `X-Polar-Batch: <batch id>`, `X-Polar-Signature: sha256=<hex
HMAC-SHA256 of "<timestamp>.<batch id>." + raw body, keyed with the batch's secret>` (the secret is in the submit
response); `X-Polar-Event: sample|group`; `X-Polar-Delivery: <event id>` (also the body's `delivery`). A receiver
checks it with `verify` below, which refuses a timestamp outside the replay window (REPLAY_WINDOW_S).
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
from typing import Any, Mapping

import httpx
import redis

from workers import batches, events
from workers.api.callback_policy import CallbackPolicy, CallbackRefused, Target, redact
from workers.manifest import read_manifest, result_path

GROUP = "polar-api"
API_PREFIX = "polar:api:batch:"
COUNTERS = "polar:api:counters"  # calls, prompt_tokens, response_tokens, samples_finished, callbacks_*
REPLAY_WINDOW_S = 300  # a receiver refuses a delivery signed longer ago (or further ahead) than this
FAILURES_KEPT = 50  # per batch, newest first
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RetryPolicy:
    attempts: int = 5
    base_s: float = 0.5  # waits 0.5, 1, 2, 4 s between attempts
    cap_s: float = 30.0
    timeout_s: float = 10.0


@dataclass(frozen=True)
class Outcome:
    """How one delivery ended: `error` is None when a 2xx came back."""

    attempts: int
    error: str | None = None


def signature(secret: str, timestamp: str, batch_id: str, body: bytes) -> str:
    signed = f"{timestamp}.{batch_id}.".encode() + body
    return "sha256=" + hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()


def verify(secret: str, headers: Mapping[str, str], body: bytes, window_s: float = REPLAY_WINDOW_S,
           now: float | None = None) -> bool:
    """What a trainer does with a callback (docs/api.md has the same check to copy): the timestamp inside the
    replay window, then the HMAC of timestamp, batch id and raw body compared in constant time."""
    h = {k.lower(): v for k, v in headers.items()}
    timestamp, batch_id = h.get("x-polar-timestamp", ""), h.get("x-polar-batch", "")
    if not timestamp.isdigit() or abs((time.time() if now is None else now) - int(timestamp)) > window_s:
        return False
    expected = signature(secret, timestamp, batch_id, body).encode()
    return hmac.compare_digest(expected, h.get("x-polar-signature", "").encode("utf-8", "replace"))


def batch_meta(r: redis.Redis, batch_id: str) -> dict[str, str]:
    return {k.decode(): v.decode() for k, v in r.hgetall(API_PREFIX + batch_id).items()}


def callback_status(r: redis.Redis, batch_id: str) -> dict[str, Any]:
    raw = {k.decode(): v.decode() for k, v in r.hgetall(API_PREFIX + batch_id + ":callbacks").items()}
    failures = [json.loads(f) for f in r.lrange(API_PREFIX + batch_id + ":callback_failures", 0, -1)]
    return {"delivered": int(raw.get("delivered", 0)), "failed": int(raw.get("failed", 0)),
            "retried": int(raw.get("retried", 0)), "last_error": raw.get("last_error"), "failures": failures}


def _post(client: httpx.Client, target: Target, headers: dict[str, str], body: bytes,
          timeout_s: float) -> httpx.Response:
    """POST to the address the policy resolved, with the URL's own Host and TLS name: no second lookup."""
    url = httpx.URL(target.url)
    pinned = url.copy_with(host=target.address)
    extensions = {"sni_hostname": target.host} if target.scheme == "https" else {}
    return client.post(pinned, content=body, headers={**headers, "host": url.netloc.decode("ascii")},
                       timeout=timeout_s, extensions=extensions)


def _attempt(client: httpx.Client, target: Target, headers: dict[str, str], body: bytes,
             timeout_s: float) -> tuple[str | None, bool]:
    """(error or None, whether trying again could help)."""
    try:
        answer = _post(client, target, headers, body, timeout_s)
    except httpx.HTTPError as e:
        return f"{type(e).__name__}: {e}", True
    if 200 <= answer.status_code < 300:
        return None, False
    if answer.is_redirect:  # never followed: a redirect could lead anywhere the policy refuses
        where = redact(answer.headers.get("location", ""))
        return f"HTTP {answer.status_code} redirect to {where!r}, not followed (answer 2xx at the URL itself)", False
    return f"HTTP {answer.status_code}", True


def deliver(client: httpx.Client, policy: CallbackPolicy, url: str, secret: str, batch_id: str, kind: str,
            delivery: str, payload: dict[str, Any], retry: RetryPolicy) -> Outcome:
    """POST the payload until a 2xx answer, signing each attempt afresh (its own timestamp)."""
    body = json.dumps({**payload, "delivery": delivery}, sort_keys=True).encode()
    error, attempts = "no attempt", 0
    for attempts in range(1, retry.attempts + 1):
        if attempts > 1:
            time.sleep(min(retry.cap_s, retry.base_s * 2 ** (attempts - 2)))
        try:
            target = policy.check(url)  # resolved once per attempt; the connection goes to that address
        except CallbackRefused as e:
            error = f"refused by the callback policy: {e}"
            break
        timestamp = str(int(time.time()))
        headers = {"content-type": "application/json", "x-polar-event": kind, "x-polar-delivery": delivery,
                   "x-polar-batch": batch_id, "x-polar-timestamp": timestamp,
                   "x-polar-signature": signature(secret, timestamp, batch_id, body)}
        error, again = _attempt(client, target, headers, body, retry.timeout_s)
        if error is None:
            return Outcome(attempts)
        if not again:
            break
    return Outcome(attempts, f"{kind} {payload.get('sample_id') or payload.get('group_id')}: {error} "
                             f"after {attempts} attempt{'s' if attempts != 1 else ''}")


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

    def __init__(self, r: redis.Redis, consumer: str, policy: RetryPolicy = RetryPolicy(),
                 hosts: CallbackPolicy | None = None, workers: int = 4) -> None:
        self.r, self.consumer, self.policy = r, consumer, policy
        self.hosts = hosts or CallbackPolicy.of()
        self.pool = ThreadPoolExecutor(workers, thread_name_prefix="polar-callback")
        # No proxy from the environment (it would make the connection, not us) and no redirects.
        self.http = httpx.Client(trust_env=False, follow_redirects=False)
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
        outcome = deliver(self.http, self.hosts, url, secret, batch_id, kind, delivery, payload, self.policy)
        k, failures = API_PREFIX + batch_id + ":callbacks", API_PREFIX + batch_id + ":callback_failures"
        pipe = self.r.pipeline()
        pipe.hincrby(k, "failed" if outcome.error else "delivered", 1)
        pipe.hincrby(k, "retried", outcome.attempts - 1)
        pipe.hincrby(COUNTERS, "callbacks_failed" if outcome.error else "callbacks_delivered", 1)
        if outcome.error:
            failure = {"event": kind, "delivery": delivery, "attempts": outcome.attempts, "error": outcome.error,
                       "at": time.time(), "id": payload.get("sample_id") or payload.get("group_id")}
            pipe.hset(k, "last_error", outcome.error)
            pipe.lpush(failures, json.dumps(failure))
            pipe.ltrim(failures, 0, FAILURES_KEPT - 1)
            pipe.expire(failures, batches.TTL_S)
            log.warning("polar api: callback of batch %s to %s failed: %s", batch_id, redact(url), outcome.error)
        pipe.expire(k, batches.TTL_S)
        pipe.execute()
        events.emit(self.r, "callback", batch_id=batch_id, event=kind, delivery=delivery,
                    delivered=outcome.error is None, attempts=outcome.attempts, error=outcome.error)
