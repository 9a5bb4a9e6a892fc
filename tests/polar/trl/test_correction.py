"""polar.trl.correction: per-call staleness masks and truncated importance weights from recorded logprobs."""
from __future__ import annotations

import math

import pytest
import torch

from polar.trl.correction import CorrectionStats, staleness_mask, tis_weights


def test_staleness_masks_each_call_older_than_the_limit():
    # two calls of 2 sampled tokens with one template token between them; made at versions 3 and 4
    mask, calls = [1, 1, 0, 1, 1], [(0, 2, 3), (3, 5, 4)]
    assert staleness_mask(mask, calls, trainer_version=4, max_staleness=0) == ([0, 0, 0, 1, 1], 1)
    assert staleness_mask(mask, calls, trainer_version=4, max_staleness=1) == (mask, 0)
    assert staleness_mask(mask, calls, trainer_version=6, max_staleness=1) == ([0, 0, 0, 0, 0], 2)
    assert staleness_mask(mask, calls, trainer_version=9, max_staleness=None) == (mask, 0)  # no limit
    assert staleness_mask(mask, [(0, 2, None), (3, 5, 4)], 6, 1) == ([1, 1, 0, 0, 0], 1)  # no version: kept


def test_weights_are_the_ratio_truncated_at_the_cap_and_zero_where_masked():
    trainer = torch.tensor([-1.0, -1.0, -1.0, -0.5])
    recorded = torch.tensor([-1.0, -2.0, 0.0, -0.5])  # ratios 1, e, 1/e; the last token is masked
    w, ratio = tis_weights(trainer, recorded, torch.tensor([1.0, 1.0, 1.0, 0.0]), cap=2.0)
    assert ratio.tolist() == pytest.approx([1.0, math.e, 1 / math.e, 0.0])
    assert w.tolist() == pytest.approx([1.0, 2.0, 1 / math.e, 0.0])


def test_stats_count_the_capped_fraction():
    stats = CorrectionStats(cap=2.0)
    stats.add(torch.tensor([1.0, 3.0, 0.5, 2.0]))
    stats.add(torch.tensor([]))
    s = stats.summary()
    assert (s["tokens"], s["capped_fraction"], s["ratio_max"], s["ratio_min"]) == (4, 0.25, 3.0, 0.5)
    assert math.isnan(CorrectionStats(cap=2.0).summary()["ratio_mean"])
