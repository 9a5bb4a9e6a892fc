"""The trainer's side of the fidelity check: recompute, with the trainer's model, the logprobs of the response
tokens Polar recorded, and compare them with the engine's. Before an update (same weights) they must agree:
the importance ratio exp(new - old) is 1."""
from __future__ import annotations

from typing import Any

import torch

from polar.trl.rollouts import Row


@torch.no_grad()
def recompute(model: Any, row: Row) -> torch.Tensor:
    """log_softmax of the model's raw logits at each response token (one unpadded sequence)."""
    ids = torch.tensor([row.prompt_ids + row.response_ids])
    logits = model(input_ids=ids).logits[0, len(row.prompt_ids) - 1:-1].float()
    return torch.log_softmax(logits, dim=-1).gather(1, ids[0, len(row.prompt_ids):, None])[:, 0]


def max_abs_error(model: Any, rows: list[Row]) -> float:
    """Largest |trainer - recorded| logprob over the trained (mask 1) tokens of the usable rows."""
    worst = 0.0
    for row in rows:
        if not row.usable:
            continue
        mask = torch.tensor(row.loss_mask, dtype=torch.bool)
        diff = (recompute(model, row) - torch.tensor(row.old_logprobs))[mask]
        if diff.numel():
            worst = max(worst, float(diff.abs().max()))
    return worst
