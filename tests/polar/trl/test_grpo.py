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

from polar import PolarClient
from polar.trl.grpo import TrainConfig, train
from polar.trl.local import local_cluster
from polar.trl.task import write_tasks
from polar.trl.rollouts import PolarRollouts, RolloutConfig
from polar.trl.weights import FenceWeightTransfer, engine_versions
from polar_traj.reading import SessionFile, read_session

STEPS, GROUPS, GROUP_SIZE = 3, 2, 4
TWO_CALLS = str(Path(__file__).with_name("two-call.yaml"))


def call_versions(batch_dir: Path) -> dict[str, int]:
    """policy_version of every CallRecord in the batch's capture files, by call id."""
    found = {}
    for f in sorted(batch_dir.glob("samples/*/attempt-*/captures/**/*.jsonl")):
        for record in read_session(SessionFile(f.parent.name, f.name[:-len(".jsonl")], f), strict=False).records:
            found[record.call_id] = record.policy_version
    return found


@pytest.fixture(scope="module")
def run(tmp_path_factory, tiny_model_dir: Path):
    out = tmp_path_factory.mktemp("trl")
    tasks = write_tasks(out / "tasks.yaml", GROUPS)
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
    # the importance ratio against the recorded logprobs is 1: every row at the trainer's version, nothing capped
    assert all(abs(r.is_mean - 1) <= 1e-4 and abs(r.is_max - 1) <= 1e-4 and r.is_capped == 0 for r in reports)
    assert all(r.rows_per_lag == {0: GROUPS * GROUP_SIZE} and r.masked_calls == 0 for r in reports)


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
    batch = client.submit(tasks, group_size=8, out=out / "overlap", sampling=RolloutConfig(1, out).sampling)
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
    rollouts = PolarRollouts(client, tasks, RolloutConfig(group_size=2, out=out / "multi"), TWO_CALLS)
    step = rollouts.collect(rollouts.task_ids)
    merged = [r for r in step.usable if 0 in r.loss_mask[r.loss_mask.index(1):]]  # sampled, then mask 0
    assert len(step.usable) == len(step.rows) == 2 * GROUPS and merged
    assert max_abs_error(model, step.usable) <= 1e-4


def push_after_first_calls(sync: FenceWeightTransfer, model, engine: str, first_calls: int) -> None:
    """New weights to the engine once it has seen `first_calls` more requests (each sample's first call; its
    second comes 2 s after the first's reply: two-call.yaml)."""
    deadline, target = time.monotonic() + 240, engine_requests(engine) + first_calls
    while time.monotonic() < deadline:
        if engine_requests(engine) >= target:
            sync.push(model)
            return
        time.sleep(0.02)


def test_calls_spanning_a_weight_update_are_weighed_and_masked_per_call(run, tiny_model_dir: Path):
    """A two-call task whose samples span a weight update (their first call at version v, the second at v+1):
    the rows carry both versions per call; with max_staleness 0 the v call's tokens are masked and counted, the
    v+1 call trained; the trainer (holding the v+1 weights) sees an importance ratio of 1 on the v+1 call and
    not on the v call, whose weights are the ratio truncated at the cap."""
    import threading

    import torch
    from transformers import AutoModelForCausalLM

    from polar.trl.correction import tis_weights
    from polar.trl.logprobs import recompute

    out, _, _, c, tasks = run
    client = PolarClient(c.broker, c.sessions)
    v = int(engine_versions([c.engine])[0])
    torch.manual_seed(0)
    new = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    with torch.no_grad():
        for p in new.parameters():
            p.add_(0.05 * torch.randn_like(p))  # another policy: the two versions' logprobs differ
    sync = FenceWeightTransfer(client, [c.engine], tiny_model_dir, out / "span-weights", version=v)
    rollouts = PolarRollouts(client, tasks, RolloutConfig(group_size=2, out=out / "span", max_staleness=0),
                             TWO_CALLS)
    pusher = threading.Thread(target=push_after_first_calls, args=(sync, new, c.engine, 2))
    pusher.start()
    rollouts.update_model_version(v + 1)  # the trainer's version once the push is done
    step = rollouts.collect(rollouts.task_ids[:1])
    pusher.join()
    assert sync.version == v + 1 and len(step.rows) == 2
    spanning = [r for r in step.rows if [c[2] for c in r.call_outputs] == [v, v + 1]]
    assert spanning, [r.call_outputs for r in step.rows]
    assert step.masked_calls == sum(c[2] == v for r in step.rows for c in r.call_outputs)
    for row in spanning:
        (a0, a1, _), (b0, b1, _) = row.call_outputs
        assert not row.stale and row.loss_mask[a0:a1] == [0] * (a1 - a0) and all(row.loss_mask[b0:b1])
        trainer, recorded = recompute(new, row), torch.tensor(row.old_logprobs)
        ones = torch.zeros(len(row.response_ids))
        ones[a0:a1], ones[b0:b1] = 1.0, 1.0
        w, ratio = tis_weights(trainer, recorded, ones, cap=1.0)
        assert (ratio[b0:b1] - 1).abs().max() <= 1e-4  # sampled by the trainer's own weights
        assert (ratio[a0:a1] - 1).abs().max() > 1e-2  # one version stale: another policy
        assert torch.equal(w[a0:a1], ratio[a0:a1].clamp(max=1.0))


def test_the_summary_windows_never_share_a_step():
    """A 3-step run's first and last windows are one step each (before: five each, the whole run both times,
    so "first 5 -> last 5" read 0.5 -> 0.5 on a run that went 0 -> 1)."""
    from polar.trl.grpo import StepReport, summarize

    def report(step: int, reward: float) -> StepReport:
        return StepReport(step, "b", 4, reward, 0.0, 1.0, 1.0, [step], 1.0, 1.0, 0.0, {0: 4}, 0, 0, str(step),
                          1.0, 0.5, 0.1)

    s = summarize([report(0, 0.0), report(1, 0.5), report(2, 1.0)])
    assert (s["window"], s["reward_first"], s["reward_last"]) == (1, 0.0, 1.0)
    s = summarize([report(i, i / 11) for i in range(12)])
    assert s["window"] == 5 and s["reward_first"] == sum(range(5)) / 5 / 11
