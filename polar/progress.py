"""A batch's progress: the counts PolarClient's batches hand back over either transport (Redis, workers/client.py
via workers/batches.py; HTTP, polar/client.py), so neither needs the other's package."""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

RUNNING, COMPLETED, CANCELLED = "running", "completed", "cancelled"


@dataclass(frozen=True)
class Progress:
    total: int
    queued: int
    running: int
    done: int
    masked: int
    cancelled: int
    groups_done: int
    groups: int
    reward_mean: float | None
    status: str
    nodes: dict[str, int]
    reassigned: int = 0  # samples started again elsewhere because their node was lost or drained

    @property
    def finished(self) -> bool:
        return self.status in (COMPLETED, CANCELLED)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def line(self) -> str:
        mean = "-" if self.reward_mean is None else f"{self.reward_mean:.3f}"
        return (f"{self.done + self.masked}/{self.total} done ({self.masked} masked), {self.running} running, "
                f"{self.queued} queued, {self.cancelled} cancelled; groups {self.groups_done}/{self.groups}; "
                f"reward mean {mean}; {self.status}" + (f"; {self.reassigned} reassigned" if self.reassigned else ""))
