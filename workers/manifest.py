"""A batch on shared storage: `<out>/<batch_id>/batch.json` names the tasks file, the group size and every
sample (id, task, group), written once by the client; workers only read it.

Layout of a batch folder:
  batch.json                      this manifest
  outcome.json                    how the batch ended (status, counts), written once it has
  samples/<sample_id>/attempt-<k>/  one attempt's sample folder (polar.run.sample's stages); ABANDONED.json when
                                  a worker died under it or its infrastructure failed
  samples/<sample_id>/result.json the sample's final SampleResult (JSON), with the node, engine and model
  trajectories/<group_id>.parquet one part per finished group, with advantages: the dataset pandas reads
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import secrets
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from polar_mitm.sessions.sampling import parse_sampling, sampling_dict
from polar_traj import atomic
from polar_traj.records import check_id
from polar_traj.schema import STRATEGIES

MAX_GROUP_ID = 120  # + ".<k>" stays within the 128 characters of an id


@dataclass(frozen=True)
class SampleEntry:
    sample_id: str
    task_id: str
    group_id: str


@dataclass(frozen=True)
class Manifest:
    batch_id: str
    batch_dir: Path
    tasks_file: Path
    group_size: int
    samples: tuple[SampleEntry, ...]
    adapter: str | None = None  # overrides each task's adapter
    min_groups: int | None = None
    max_staleness: int | None = None
    created: float = field(default_factory=time.time)
    sampling: dict[str, Any] | None = None  # fixed for every LLM call of the batch (polar_mitm/sessions/sampling.py)
    strategy: str = "prefix_merge"  # how each sample's trajectories are built: prefix_merge | per_request
    tasks_roots: tuple[str, ...] | None = None  # where its tasks' paths may lead (polar/tasks/roots.py)
    run_offline: bool = False  # verifiers of tasks that ask for the internet run offline (no egress proxy)

    @property
    def groups(self) -> list[str]:
        return list(dict.fromkeys(s.group_id for s in self.samples))

    def sample(self, sample_id: str) -> SampleEntry:
        for s in self.samples:
            if s.sample_id == sample_id:
                return s
        raise KeyError(f"sample {sample_id!r} is not in batch {self.batch_id}")

    def group(self, group_id: str) -> list[SampleEntry]:
        return [s for s in self.samples if s.group_id == group_id]

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.update(batch_dir=str(self.batch_dir), tasks_file=str(self.tasks_file))
        return data


def new_batch_id() -> str:
    return f"b{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"


def _fit(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return text[:limit - 9] + "-" + hashlib.sha1(text.encode()).hexdigest()[:8]


def plan(batch_id: str, batch_dir: Path, tasks_file: Path, task_ids: list[str], group_size: int,
         adapter: str | None = None, min_groups: int | None = None, max_staleness: int | None = None,
         sampling: dict[str, Any] | None = None, strategy: str = "prefix_merge") -> Manifest:
    """Every sample of the batch: `group_size` per task, ids `<batch>.<task>.<k>` (contract 1). `sampling`: values
    every LLM call of the batch is sampled with (raises ValueError naming a bad one)."""
    check_id(batch_id, "batch_id")
    if not task_ids:
        raise ValueError(f"{tasks_file}: no tasks")
    dupes = sorted({t for t in task_ids if task_ids.count(t) > 1})
    if dupes:
        raise ValueError(f"{tasks_file}: task ids must be unique in a batch, repeated: {', '.join(dupes)}")
    if not 1 <= group_size <= 999:
        raise ValueError(f"group size {group_size}: expected 1-999")
    if min_groups is not None and not 1 <= min_groups <= len(task_ids):
        raise ValueError(f"min_groups {min_groups}: expected 1-{len(task_ids)} (the number of tasks)")
    if max_staleness is not None and max_staleness < 0:
        raise ValueError(f"max_staleness {max_staleness}: expected 0 or more")
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy {strategy!r}: expected one of {', '.join(STRATEGIES)}")
    sampling = sampling_dict(parse_sampling(sampling))
    samples = []
    for task_id in task_ids:
        group = check_id(_fit(f"{batch_id}.{check_id(task_id, 'task_id')}", MAX_GROUP_ID), "group_id")
        samples += [SampleEntry(f"{group}.{k}", task_id, group) for k in range(group_size)]
    return Manifest(batch_id, batch_dir, tasks_file, group_size, tuple(samples), adapter, min_groups, max_staleness,
                    sampling=sampling, strategy=strategy)


def write_manifest(manifest: Manifest) -> Path:
    path = manifest.batch_dir / "batch.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, manifest.to_dict())
    return path


def read_manifest(path: str | os.PathLike) -> Manifest:
    """The batch's manifest; parsed once per process while the file is unchanged (written once by the client, read
    by every stage of every sample: a 1,000-sample batch's is ~100 KB, 1.7 ms to parse each time)."""
    st = os.stat(path)
    return _parsed_manifest(os.fspath(path), st.st_mtime_ns, st.st_size)


@functools.lru_cache(maxsize=16)
def _parsed_manifest(path: str, _mtime_ns: int, _size: int) -> Manifest:
    data = json.loads(Path(path).read_text())
    samples = tuple(SampleEntry(**s) for s in data.pop("samples"))
    return Manifest(**{**data, "batch_dir": Path(data["batch_dir"]), "tasks_file": Path(data["tasks_file"]),
                       "samples": samples})


def write_json(path: Path, data: Any) -> None:
    """Whole or not at all: a temp name in the same folder, renamed."""
    atomic.write_text(path, json.dumps(data, indent=2))


def sample_dir(manifest: Manifest, sample_id: str) -> Path:
    return manifest.batch_dir / "samples" / sample_id


def result_path(manifest: Manifest, sample_id: str) -> Path:
    return sample_dir(manifest, sample_id) / "result.json"
