"""Merge statistics of a batch: how many calls became how many trajectories, and why chains broke."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from .chains import REASONS, START_KINDS
from .lineage import ROLES


@dataclass
class MergeStats:
    strategy: str = ""
    sessions: int = 0
    calls: int = 0  # usable calls (records without error)
    error_calls: int = 0  # records with an error: never trained, listed in metadata
    invalid_records: int = 0  # lines skipped by a non-strict read
    trajectories: int = 0
    calls_merged: int = 0  # calls that joined an existing chain instead of starting one
    starts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(START_KINDS, 0))
    breaks: dict[str, int] = field(default_factory=lambda: dict.fromkeys(REASONS, 0))
    roles: dict[str, int] = field(default_factory=lambda: dict.fromkeys(ROLES, 0))  # trajectories by lineage role
    per_request_tokens: int = 0  # sum of prompt + output over calls: what per_request would train on
    trajectory_tokens: int = 0  # sum of prompt + response over the trajectories built
    trained_tokens: int = 0  # mask-1 tokens (sampled tokens; equal under both strategies)
    truncated_calls: int = 0
    missing_logprob_calls: int = 0

    @property
    def tokens_saved(self) -> int:
        return self.per_request_tokens - self.trajectory_tokens

    @property
    def token_ratio(self) -> float | None:
        """Trainer tokens per_request ÷ this strategy."""
        return self.per_request_tokens / self.trajectory_tokens if self.trajectory_tokens else None

    def add(self, other: "MergeStats") -> None:
        for name, value in asdict(other).items():
            if name == "strategy":
                self.strategy = self.strategy or value
            elif isinstance(value, dict):
                mine = getattr(self, name)
                for key, count in value.items():
                    mine[key] = mine.get(key, 0) + count
            else:
                setattr(self, name, getattr(self, name) + value)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["tokens_saved"] = self.tokens_saved
        data["token_ratio"] = self.token_ratio
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "MergeStats":
        names = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in data.items() if k in names})

    def summary_lines(self) -> list[str]:
        ratio = f"{self.token_ratio:.2f}x" if self.token_ratio else "n/a"
        breaks = ", ".join(f"{k} {v}" for k, v in self.breaks.items())
        return [
            f"strategy {self.strategy}: {self.sessions} sessions, {self.calls} calls -> {self.trajectories} trajectories"
            f" ({self.calls_merged} calls merged, {self.error_calls} error calls skipped)",
            f"chain starts: new {self.starts.get('new', 0)}, fork {self.starts.get('fork', 0)},"
            f" break {self.starts.get('break', 0)} ({breaks})",
            "lineage: " + ", ".join(f"{k} {v}" for k, v in self.roles.items()),
            f"trainer tokens: per_request {self.per_request_tokens}, built {self.trajectory_tokens},"
            f" saved {self.tokens_saved} ({ratio}); sampled tokens {self.trained_tokens}",
        ]
