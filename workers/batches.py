"""Batch bookkeeping in Redis (the broker's server): plain functions on a redis client, used by the Celery tasks,
the client and the CLI alike.

Keys, all under `polar:batch:<batch_id>`:
  (hash)           batch.json's path, status (running|completed|cancelled), group_size, groups, min_groups
  :samples (hash)  sample_id -> JSON {stage, node, attempt, task, status, failure, reward, reason, and, once its
                   node was lost: reassigned (count), reassigned_from (nodes)}
  :final:<group>   (set) sample ids of the group that reached a final state (done or masked)
  :groups (set)    groups whose advantages are written
A sample's `task` is the Celery task id of its current stage, so a cancel can revoke it, and a message whose
task id is no longer the sample's (a stale attempt: its node was lost and the sample reassigned) is discarded.
"""
from __future__ import annotations

import functools
import json
import time
from typing import Any

import redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

from polar.progress import CANCELLED, COMPLETED, RUNNING, Progress  # noqa: F401 (re-exported)
from workers import events

PREFIX = "polar:batch:"
STAGES = ("queued", "prepare", "run", "evaluate", "postrun", "retry")
FINAL = ("done", "masked", "cancelled")
TTL_S = 14 * 24 * 3600


def connect(url: str, retry_s: float = 60.0) -> redis.Redis:
    """A redis client for a broker URL (redis://, rediss://, or kombu's redis+socket:// / socket://). Each command
    retries a lost connection for about `retry_s` seconds, so a Redis restart is ridden out, not failed."""
    retry = dict(retry=Retry(ExponentialBackoff(cap=2.0, base=0.1), max(1, int(retry_s / 2))),
                 retry_on_error=[redis.ConnectionError, redis.TimeoutError])
    for scheme in ("redis+socket://", "socket://"):
        if url.startswith(scheme):
            path, _, query = url[len(scheme):].partition("?")
            db = dict(p.split("=", 1) for p in query.split("&") if "=" in p).get("virtual_host", "0")
            return redis.Redis(unix_socket_path=path, db=int(db), **retry)
    return redis.Redis.from_url(url, **retry)


@functools.lru_cache(maxsize=4)
def shared(url: str) -> redis.Redis:
    """This process's client for a broker, for its tasks: one connection pool kept across tasks (a new client per
    stage cost a connection and its handshake each time). redis-py's pool starts afresh in a forked child."""
    return connect(url)


def unreachable(url: str, wait_s: float) -> str | None:
    """Why the Redis at `url` does not answer after retrying for about `wait_s` (None when it does): a node
    checks its broker before it says it is up, instead of saying so and then retrying forever."""
    try:
        connect(url, retry_s=wait_s).ping()
    except (redis.RedisError, OSError, ValueError) as e:
        return " ".join(str(e).split())[:200]
    return None


def key(batch_id: str, *parts: str) -> str:
    return ":".join((PREFIX + batch_id, *parts))


def create(r: redis.Redis, batch_id: str, manifest_path: str, samples: list[str], group_size: int, groups: int,
           min_groups: int | None) -> None:
    if r.exists(key(batch_id)):
        raise ValueError(f"batch {batch_id} already exists")
    pipe = r.pipeline()
    pipe.hset(key(batch_id), mapping={"manifest": manifest_path, "status": RUNNING, "group_size": group_size,
                                      "groups": groups, "min_groups": min_groups or 0, "created": time.time()})
    pipe.hset(key(batch_id, "samples"), mapping={s: json.dumps({"stage": "queued"}) for s in samples})
    for k in (key(batch_id), key(batch_id, "samples")):
        pipe.expire(k, TTL_S)
    pipe.execute()
    events.emit(r, "batch", batch_id=batch_id, status=RUNNING, samples=len(samples), groups=groups)


def info(r: redis.Redis, batch_id: str) -> dict[str, str]:
    raw = r.hgetall(key(batch_id))
    if not raw:
        raise KeyError(f"no batch {batch_id!r} in {r.connection_pool.connection_kwargs.get('path') or 'redis'}")
    return {k.decode(): v.decode() for k, v in raw.items()}


def batch_ids(r: redis.Redis) -> list[str]:
    """Every batch this broker still keeps (TTL_S after its creation), newest first."""
    found = []
    for raw in r.scan_iter(match=PREFIX + "*", count=1000):
        name = raw.decode()[len(PREFIX):]
        if ":" not in name and r.type(raw) == b"hash":  # the batch's own hash, not one of its sub-keys
            found.append((float(r.hget(raw, "created") or 0), name))
    return [name for _, name in sorted(found, reverse=True)]


def status(r: redis.Redis, batch_id: str) -> str:
    value = r.hget(key(batch_id), "status")
    return value.decode() if value else CANCELLED


def set_status(r: redis.Redis, batch_id: str, new: str) -> bool:
    """Move a running batch to `new`; False when it had already finished (first writer wins)."""
    script = ("if redis.call('hget', KEYS[1], 'status') == 'running' then "
              "redis.call('hset', KEYS[1], 'status', ARGV[1]) return 1 end return 0")
    changed = bool(r.eval(script, 1, key(batch_id), new))
    if changed:
        events.emit(r, "batch", batch_id=batch_id, status=new)
    return changed


def sample_state(r: redis.Redis, batch_id: str, sample_id: str) -> dict[str, Any]:
    raw = r.hget(key(batch_id, "samples"), sample_id)
    return json.loads(raw) if raw else {}


# Write ARGV[3] only while the sample's task is still ARGV[2] (compare and set on the stage's task id).
_CAS = ("local raw = redis.call('hget', KEYS[1], ARGV[1]) "
        "local task = raw and cjson.decode(raw)['task'] or '' "
        "if task == ARGV[2] then redis.call('hset', KEYS[1], ARGV[1], ARGV[3]) return 1 end return 0")


def update_sample(r: redis.Redis, batch_id: str, sample_id: str, if_task: str | None = None,
                  **fields: Any) -> dict[str, Any] | None:
    """Merge fields into a sample's state (one writer at a time per sample: its current stage); a new stage
    also records when it was entered (`t_<stage>`, unix seconds). With `if_task`: only while the sample's
    current task is still that one; None when it is not (the writer is stale)."""
    if "stage" in fields:
        fields[f"t_{fields['stage']}"] = time.time()
    before = sample_state(r, batch_id, sample_id)
    state = {**before, **fields}
    if if_task is None:
        r.hset(key(batch_id, "samples"), sample_id, json.dumps(state))
    elif not r.eval(_CAS, 1, key(batch_id, "samples"), sample_id, if_task, json.dumps(state)):
        return None
    if "stage" in fields and fields["stage"] != before.get("stage"):  # a change of stage, not a stage's own writes
        events.emit(r, "sample", batch_id=batch_id, sample_id=sample_id, stage=state["stage"],
                    prev=before.get("stage"), node=state.get("node"), reward=state.get("reward"),
                    status=state.get("status"))
    return state


def samples(r: redis.Redis, batch_id: str) -> dict[str, dict[str, Any]]:
    return {k.decode(): json.loads(v) for k, v in r.hgetall(key(batch_id, "samples")).items()}


def mark_final(r: redis.Redis, batch_id: str, group_id: str, sample_id: str) -> int:
    """Record a sample of the group as final; returns how many of the group are."""
    k = key(batch_id, "final", group_id)
    pipe = r.pipeline()
    pipe.sadd(k, sample_id)
    pipe.scard(k)
    pipe.expire(k, TTL_S)
    return int(pipe.execute()[1])


def mark_group_done(r: redis.Redis, batch_id: str, group_id: str) -> int:
    """Record a group's advantages as written; returns how many groups are done."""
    k = key(batch_id, "groups")
    pipe = r.pipeline()
    pipe.sadd(k, group_id)
    pipe.scard(k)
    pipe.expire(k, TTL_S)
    added, done = pipe.execute()[:2]
    if added:  # a group written again (a redelivered message) is announced once
        events.emit(r, "group", batch_id=batch_id, group_id=group_id, groups_done=int(done))
    return int(done)


def groups_done(r: redis.Redis, batch_id: str) -> set[str]:
    return {g.decode() for g in r.smembers(key(batch_id, "groups"))}


def progress(r: redis.Redis, batch_id: str) -> Progress:
    meta = info(r, batch_id)
    states = samples(r, batch_id).values()
    count = {s: 0 for s in (*FINAL, "queued")}
    nodes: dict[str, int] = {}
    rewards = []
    reassigned = 0
    for st in states:
        stage = st.get("stage", "queued")
        if stage in count:
            count[stage] += 1
        if st.get("node"):
            nodes[st["node"]] = nodes.get(st["node"], 0) + 1
        if stage == "done" and st.get("reward") is not None:
            rewards.append(float(st["reward"]))
        reassigned += bool(st.get("reassigned"))
    total = len(states)
    running = total - sum(count.values())
    return Progress(total, count["queued"], running, count["done"], count["masked"], count["cancelled"],
                    r.scard(key(batch_id, "groups")), int(meta["groups"]),
                    sum(rewards) / len(rewards) if rewards else None, meta["status"], nodes, reassigned)
