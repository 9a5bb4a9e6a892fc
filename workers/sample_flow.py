"""One sample's stages as plain functions over its folders, calling polar.run.sample's stages (the same code path as
`polar run --task`). The Celery tasks in workers/stage_tasks.py are thin wrappers around these.

Attempts: each prepare makes a fresh `samples/<sample_id>/attempt-<k>/` and abandons every earlier attempt that
did not finish. A run stage that finds its own start mark was redelivered (its worker died under it): that
attempt is abandoned and the sample starts over under the same sample id. Abandoning keeps what was recorded:
the session's capture file moves into the attempt folder (`abandoned-captures/`), ABANDONED.json says why, and
the session is unregistered; no part is ever built from an abandoned attempt. An attempt whose node was lost
(workers/heartbeat.py) is abandoned the same way by the node that starts the sample again, kind `node_lost`.
"""
from __future__ import annotations

import functools
import json
import os
import signal
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, Iterator, Mapping, Sequence

from polar_mitm.launch import ProxyProcess
from polar_traj.captures import copy_capture
from workers.manifest import Manifest, sample_dir, write_json
from workers.settings import WorkerSettings

ABANDONED = "ABANDONED.json"
RUN_MARK = "worker-run.json"


class Cancelled(BaseException):
    """SIGTERM from a revoke while the harness runs (a BaseException, so it passes every `except Exception`)."""


@dataclass(frozen=True)
class NodeContext:
    settings: WorkerSettings
    proxy: ProxyProcess


def attempts(sdir: Path) -> list[Path]:
    found = [p for p in sdir.glob("attempt-*") if p.name[8:].isdigit()]
    return sorted(found, key=lambda p: int(p.name[8:]))


def live_attempt(sdir: Path) -> Path | None:
    """The latest attempt, unless it was abandoned."""
    found = attempts(sdir)
    return found[-1] if found and not (found[-1] / ABANDONED).exists() else None


def infra_failures(sdir: Path) -> int:
    return sum(1 for a in attempts(sdir) if (a / ABANDONED).exists()
               and json.loads((a / ABANDONED).read_text()).get("kind") == "infrastructure")


def engine_config(settings: WorkerSettings):
    from polar.run.session import EngineConfig

    return EngineConfig(settings.model_dir, backend=settings.engine_url, engine=settings.engine,
                        render=settings.render)


def sample_config(manifest: Manifest, sample_id: str, settings: WorkerSettings, out: Path):
    from polar.harness.adapters import load_adapter
    from polar.run.sample import SampleConfig

    entry = manifest.sample(sample_id)
    tasks = tasks_by_id(manifest.tasks_file, manifest.tasks_roots)
    if entry.task_id not in tasks:
        raise ValueError(f"{manifest.tasks_file}: task {entry.task_id!r} is gone")
    task = tasks[entry.task_id]
    adapter = manifest.adapter or task.adapter
    if not adapter:
        raise ValueError(f"task {task.task_id}: no adapter (give one in the task or with --adapter)")
    return SampleConfig(task=task, adapter=load_adapter(adapter), out=out, sample_id=sample_id,
                        group_id=entry.group_id, runtime=settings.runtime, way_in=settings.way_in,
                        sampling=manifest.sampling, strategy=manifest.strategy,
                        verifier_hosts=None if manifest.run_offline else settings.verifier_hosts)


def tasks_by_id(tasks_file: Path, roots: Sequence[str] | None) -> Mapping[str, Any]:
    """The batch's tasks by id: a task file is parsed once per process while it is unchanged (every prepare reads
    it); a Harbor folder each time (its files may change under an unchanged folder)."""
    from polar.tasks.load import load_tasks

    if tasks_file.is_dir():
        return {t.task_id: t for t in load_tasks(tasks_file, roots)}
    st = tasks_file.stat()
    return _parsed_tasks(str(tasks_file), tuple(roots) if roots is not None else None,
                         os.environ.get("POLAR_TASKS_ROOT"), st.st_mtime_ns, st.st_size)


@functools.lru_cache(maxsize=8)
def _parsed_tasks(path: str, roots: tuple[str, ...] | None, _env_root: str | None, _mtime_ns: int,
                  _size: int) -> Mapping[str, Any]:
    from polar.tasks.load import load_tasks

    return MappingProxyType({t.task_id: t for t in load_tasks(path, roots)})


SUPERSEDED = ("superseded by a new attempt (its worker was lost)", "worker_lost")


def abandon_open(sdir: Path, proxy: ProxyProcess, why: tuple[str, str] = SUPERSEDED) -> None:
    """Abandon every attempt of the sample that did not finish; `why`: (reason, kind)."""
    for old in attempts(sdir):
        if not (old / ABANDONED).exists():
            abandon(old, proxy, *why)


def prepare(manifest: Manifest, sample_id: str, ctx: NodeContext, why: tuple[str, str] = SUPERSEDED) -> Path:
    """A fresh attempt, prepared (sandbox, workspace, session); returns its folder. Earlier attempts that did not
    finish are abandoned first, `why` saying why."""
    from polar.run.sample import prepare_sample

    sdir = sample_dir(manifest, sample_id)
    abandon_open(sdir, ctx.proxy, why)
    out = sdir / f"attempt-{len(attempts(sdir)) + 1}"
    cfg = sample_config(manifest, sample_id, ctx.settings, out)
    return prepare_sample(cfg, engine_config(ctx.settings), ctx.proxy)


def run(attempt: Path, node: str) -> bool:
    """The harness; False when this run was already started once (a redelivery: start the sample over)."""
    from polar.run.sample import run_harness

    mark = attempt / RUN_MARK
    if mark.exists():
        return False
    write_json(mark, {"node": node, "pid": os.getpid(), "started_at": time.time()})
    with cancellable():
        run_harness(attempt)
    return True


def postrun(attempt: Path):
    """Evaluator, then the sample's Parquet part; returns its SampleResult."""
    from polar.run.sample import evaluate_sample, postrun_sample

    evaluate_sample(attempt)
    return postrun_sample(attempt)


def stop(attempt: Path) -> None:
    """End an attempt that will not finish (cancel, early stop): postrun frees its session and sandbox."""
    from polar.run.sample import postrun_sample

    if (attempt / "sample.json").exists():
        postrun_sample(attempt)


@contextmanager
def cancellable() -> Iterator[None]:
    """SIGTERM (Celery's revoke with terminate) raises Cancelled here, so the sandbox is stopped on the way out."""
    def on_term(signum: int, frame: Any) -> None:
        raise Cancelled()

    previous = signal.signal(signal.SIGTERM, on_term)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def abandon(attempt: Path, proxy: ProxyProcess, reason: str, kind: str) -> None:
    """Mark an attempt abandoned: its session ends and its sandbox stops (polar.run.sample.cleanup_sample), its capture
    moves into the attempt folder, ABANDONED.json says why; nothing of it is trained on. The capture is looked for
    where the attempt's own proxy wrote it (another node's, when that node was lost), else in `proxy`'s."""
    sessions = _sessions_of(attempt)
    moved = []
    if sessions:
        from polar.run.sample import cleanup_sample

        cleanup_sample(attempt)
        recorded = json.loads((attempt / "sample.json").read_text()).get("proxy", {}).get("capture_dir")
    for session in sessions:
        src = proxy.capture_dir / session["task_id"] / f"{session['session_id']}.jsonl"
        if recorded and (Path(recorded) / src.relative_to(proxy.capture_dir)).exists():
            src = Path(recorded) / src.relative_to(proxy.capture_dir)
        if src.exists():
            dst = copy_capture(src, attempt / "abandoned-captures" / session["task_id"] / src.name, move=True)
            moved.append(str(dst))
    write_json(attempt / ABANDONED, {"reason": reason, "kind": kind, "at": time.time(), "captures": moved})


def _sessions_of(attempt: Path) -> list[dict[str, str]]:
    """The attempt's sessions {task_id, session_id, token} from polar.run.sample's sample.json: its one, or each
    step's of a multi-step task."""
    path = attempt / "sample.json"
    if not path.exists():
        return []
    state = json.loads(path.read_text())
    found = [state.get("session")] + [step.get("session") for step in state.get("steps") or []]
    return [s for s in found if isinstance(s, dict) and s.get("session_id")]
