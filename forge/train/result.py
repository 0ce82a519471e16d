"""What a stage returns, the same for every kind: its output checkpoint, metrics, steps, tokens
per source and what it adds to the lineage (also saved inside the final checkpoint, so a
finished stage is reused on --resume; the lineage part scrubbed there as lineage.json is: it holds
settings such as reward URLs)."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Mapping

from forge.scrub import scrub_tree

if TYPE_CHECKING:
    from torch.optim.optimizer import StateDict


@dataclass
class StageResult:
    checkpoint: Path
    metrics: dict[str, float]
    steps: int = 0
    tokens_by_source: dict[str, int] = field(default_factory=dict)
    lineage: Mapping[str, object] = field(default_factory=dict)  # what the stage adds to its lineage record

    def as_dict(self) -> dict[str, object]:
        return {"checkpoint": str(self.checkpoint), "metrics": self.metrics, "steps": self.steps,
                "tokens_by_source": self.tokens_by_source, "lineage": scrub_tree(self.lineage)}

    @classmethod
    def from_dict(cls, d: StateDict) -> StageResult:  # as_dict's, read back from the final checkpoint
        return cls(Path(d["checkpoint"]), d["metrics"], d["steps"], d["tokens_by_source"], d["lineage"])
