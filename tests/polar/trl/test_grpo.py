"""The RL loop closed end to end: TRL's GRPOTrainer trains the tiny model on Polar's rollouts (real Redis, a real
worker node with its proxy, real curl sessions in bubblewrap, the real reference server), and each step's weights
reach the engine through the fence. Checked: before each update the trainer's logprobs of the recorded tokens
equal the engine's (ratio 1), the engine's version rises each step and the calls record it, and every sample is
trained on exactly once."""
from __future__ import annotations

import json
import re
import time
from pathlib import Path

import httpx
import pytest

from polar.trl.grpo import TrainConfig, train
from polar.trl.local import local_cluster
from polar.trl.task import write_tasks
from polar.trl.rollouts import PolarRollouts, RolloutConfig
from polar.trl.weights import FenceWeightTransfer, engine_versions
from polar_traj.reading import SessionFile, read_session
from workers.client import PolarClient

STEPS, GROUPS, GROUP_SIZE = 3, 2, 4


def call_versions(batch_dir: Path) -> dict[str, int]:
    """policy_version of every CallRecord in the batch's capture files, by call id."""
    found = {}
    for f in sorted(batch_dir.glob("samples/*/attempt-*/captures/**/*.jsonl")):
        for record in read_session(SessionFile(f.parent.name, f.name[:-len(".jsonl")], f), strict=False).records:
            found[record.call_id] = record.policy_version
    return found


@pytest.fixture(scope="module")
def run(tmp_path_factory, tiny_model_dir: Path):
    import yaml

    out = tmp_path_factory.mktemp("trl")
    tasks = yaml.safe_load(write_tasks(out / "tasks.yaml", GROUPS).read_text())["tasks"]
    with local_cluster(out / "services", tiny_model_dir, concurrency=2) as c:
        reports = train(PolarClient(c.broker, c.sessions), [c.engine], tasks, out,
                        TrainConfig(tiny_model_dir, STEPS, GROUPS, GROUP_SIZE), on_step=lambda r: print(r.line()))
        yield out, reports, engine_versions([c.engine]), c, tasks


def test_ratio_is_one_before_each_update(run):
    _, reports, *_ = run
    assert len(reports) == STEPS
    assert reports[0].logprob_err <= 1e-4  # the trainer and the engine agree on the recorded tokens
    assert all(r.logprob_err <= 1e-4 for r in reports)  # synchronous: every step is on-policy
    assert all(r.ratio_mean != 1.0 for r in reports)  # ... and each update moved the policy


def test_versions_rise_and_calls_record_them(run):
    out, reports, final, *_ = run
    assert [r.row_versions for r in reports] == [[i] for i in range(STEPS)]
    assert [r.engine_version for r in reports] == [str(i + 1) for i in range(STEPS)] and final == [str(STEPS)]
    for i, r in enumerate(reports):
        versions = call_versions(out / "batches" / r.batch_id)
        assert len(versions) == GROUPS * GROUP_SIZE and set(versions.values()) == {i}


def test_every_sample_trained_once(run):
    out, reports, *_ = run
    seen = [t for r in reports for t in r.trajectory_ids]
    assert len(seen) == len(set(seen)) == STEPS * GROUPS * GROUP_SIZE
    for r in reports:
        manifest = json.loads((out / "batches" / r.batch_id / "batch.json").read_text())
        samples = {s["sample_id"] for s in manifest["samples"]}
        assert {t.split("/")[0] for t in r.trajectory_ids} == samples and r.rows == len(samples)


def engine_requests(engine: str) -> int:
    text = httpx.get(f"{engine}/metrics", timeout=10).text
    return int(re.search(r"^polar_serve_requests_total (\d+)$", text, re.M).group(1))


class WatchedSync(FenceWeightTransfer):
    """Counts the engine's requests between the fence closing and opening, and holds the fence a while so
    that calls are waiting behind it."""

    def send_weights(self, iterator) -> None:
        self.seen_at_pause = engine_requests(self.engines[0])
        time.sleep(1.5)
        super().send_weights(iterator)
        self.seen_before_resume = engine_requests(self.engines[0])


def test_the_fence_holds_calls_during_a_reload_mid_batch(run, tiny_model_dir: Path):
    from transformers import AutoModelForCausalLM

    out, reports, _, c, tasks = run
    client = PolarClient(c.broker, c.sessions)
    rollouts = PolarRollouts(client, tasks, RolloutConfig(group_size=8, out=out / "overlap"))
    batch = client.submit(rollouts._tasks_file([t["task_id"] for t in tasks]), group_size=8,
                          out=out / "overlap", sampling=rollouts.config.sampling)
    while batch.progress().done < 2:  # some calls made at the old version, the rest still to come
        time.sleep(0.05)
    sync = WatchedSync(client, [c.engine], tiny_model_dir, out / "overlap-weights", version=STEPS)
    assert sync.push(AutoModelForCausalLM.from_pretrained(tiny_model_dir)) == STEPS + 1
    assert sync.seen_before_resume == sync.seen_at_pause  # the engine saw no request while paused
    batch.wait(timeout=300)
    versions = list(call_versions(out / "overlap" / batch.batch_id).values())
    assert len(versions) == 2 * 8 and set(versions) == {STEPS, STEPS + 1}  # held calls went on at the new one


def test_fidelity_on_merged_multi_call_trajectories(run, tiny_model_dir: Path):
    """Two chained calls merge into one row, the template and user turn between them at mask 0: the trainer's
    logprobs over the whole row equal the engine's at every sampled token of both calls."""
    from transformers import AutoModelForCausalLM

    from polar.trl.logprobs import max_abs_error

    out, _, _, c, tasks = run
    client = PolarClient(c.broker, c.sessions)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    FenceWeightTransfer(client, [c.engine], tiny_model_dir, out / "multi-weights",
                        version=int(engine_versions([c.engine])[0])).push(model)
    two = [{**t, "adapter": str(Path(__file__).with_name("two-call.yaml"))} for t in tasks]
    step = PolarRollouts(client, two, RolloutConfig(group_size=2, out=out / "multi")).collect(
        [t["task_id"] for t in two])
    merged = [r for r in step.usable if 0 in r.loss_mask[r.loss_mask.index(1):]]  # sampled, then mask 0
    assert len(step.usable) == len(step.rows) == 2 * len(tasks) and merged
    assert max_abs_error(model, step.usable) <= 1e-4
