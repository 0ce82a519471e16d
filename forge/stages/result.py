"""What every stage returns: its final checkpoint, metrics, tokens per source and extras."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class StageResult:
    checkpoint: Path
    metrics: dict[str, float]
    tokens_by_source: dict[str, int]
    repeats: dict[str, int]
    steps: int
    extra: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {"checkpoint": str(self.checkpoint), "metrics": self.metrics, "tokens_by_source": self.tokens_by_source,
                "repeats": self.repeats, "steps": self.steps, "extra": self.extra}

    @classmethod
    def from_dict(cls, d: dict) -> "StageResult":
        return cls(Path(d["checkpoint"]), d["metrics"], d["tokens_by_source"], d["repeats"], d["steps"], d["extra"])
