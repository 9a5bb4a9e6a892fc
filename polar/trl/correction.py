"""Off-policy correction from what Polar recorded: the engine's logprob of every sampled token is the behaviour
policy, so a row sampled under older weights is weighed per token by the truncated importance ratio

    w = min(exp(trainer logprob - recorded logprob), cap)        (TIS; the trainer's weights before its update)

and a call made more than `max_staleness` versions before the trainer's current one is not trained at all
(its tokens masked and counted). On-policy rows (lag 0) have w = 1 within the engine's numerical error.

GRPOTrainer's clipped objective still runs on top, its ratio against the trainer's own pre-update logprobs
(decoupled PPO): the weight says how far the behaviour policy was from the trainer's, the clip how far one
update may move it."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:  # torch only where ratios are computed: rows are read without it
    import torch

DEFAULT_CAP = 2.0  # TIS's usual truncation (slime and verl default to 2)


def staleness_mask(loss_mask: Sequence[int], call_outputs: Sequence[tuple[int, int, int | None]],
                   trainer_version: int, max_staleness: int | None) -> tuple[list[int], int]:
    """The loss mask with the tokens of every call older than `max_staleness` versions set to 0, and how many
    calls that masked. A call without a version is kept (the engine reported none: nothing to compare)."""
    mask = list(loss_mask)
    if max_staleness is None:
        return mask, 0
    masked = 0
    for start, end, version in call_outputs:
        if version is not None and trainer_version - version > max_staleness and any(mask[start:end]):
            mask[start:end] = [0] * (end - start)
            masked += 1
    return mask, masked


def tis_weights(trainer: torch.Tensor, recorded: torch.Tensor, mask: torch.Tensor,
                cap: float = DEFAULT_CAP) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights, ratios) per token: ratio = exp(trainer - recorded), weight = min(ratio, cap); both 0 where the
    mask is 0."""
    import torch

    ratio = torch.exp(trainer - recorded) * mask
    return torch.clamp(ratio, max=cap), ratio


@dataclass
class CorrectionStats:
    """One step's importance ratios over its trained tokens, and what staleness took out."""
    cap: float
    ratios: list["torch.Tensor"] = field(default_factory=list)
    rows_per_lag: dict[int, int] = field(default_factory=dict)  # the trainer's version - a row's oldest call's
    masked_calls: int = 0  # calls older than max_staleness: not trained
    stale_rows: int = 0  # rows with no call left to train

    def add(self, ratio: torch.Tensor) -> None:
        if ratio.numel():
            self.ratios.append(ratio)

    def summary(self) -> dict[str, float]:
        import torch

        flat = torch.cat(self.ratios) if self.ratios else torch.empty(0)
        if not flat.numel():
            return {"ratio_mean": math.nan, "ratio_max": math.nan, "ratio_min": math.nan, "capped_fraction": 0.0,
                    "tokens": 0}
        return {"ratio_mean": float(flat.mean()), "ratio_max": float(flat.max()), "ratio_min": float(flat.min()),
                "capped_fraction": float((flat > self.cap).float().mean()), "tokens": int(flat.numel())}
