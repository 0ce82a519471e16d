"""What a stage receives (StageInputs) and returns (StageResult), the same for every kind."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable


@dataclass
class StageInputs:
    checkpoint: Path                      # the checkpoint this stage starts from
    sources: dict                         # data source name -> forge.data.sources.Source
    out_dir: Path                         # stages/<name>: final/ and checkpoints/ go here
    tracker: object                       # forge.track.Tracker (or a fake with the same methods)
    resume: bool = False                  # continue from the newest checkpoint in out_dir
    outputs: dict[str, Path] = field(default_factory=dict)  # earlier stages' checkpoints, by name
    log: Callable = print
    run_id: str | None = None             # the run identity (forge.rundir); resume continues only its checkpoints


@dataclass
class StageResult:
    checkpoint: Path
    metrics: dict[str, float]
    steps: int = 0
    tokens_by_source: dict[str, int] = field(default_factory=dict)
    lineage: dict = field(default_factory=dict)  # what the stage adds to its lineage record

    def as_dict(self) -> dict:
        return {"checkpoint": str(self.checkpoint), "metrics": self.metrics, "steps": self.steps,
                "tokens_by_source": self.tokens_by_source, "lineage": self.lineage}

    @classmethod
    def from_dict(cls, d: dict) -> "StageResult":
        return cls(Path(d["checkpoint"]), d["metrics"], d["steps"], d["tokens_by_source"], d["lineage"])
