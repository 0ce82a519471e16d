"""What a stage receives (StageInputs) and returns (StageResult, forge.train.result), the same for every kind."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from forge.recipe import Parallelism
from forge.track.protocol import Tracker
from forge.train.meter import Flops
from forge.train.result import StageResult

__all__ = ["StageInputs", "StageResult"]


@dataclass
class StageInputs:
    checkpoint: Path                      # the checkpoint this stage starts from
    sources: dict[str, Any]               # data source name -> forge.data.sources.Source
    out_dir: Path                         # stages/<name>: final/ and checkpoints/ go here
    tracker: Tracker                      # forge.track.MlflowTracker, or a test recorder
    resume: bool = False                  # continue from the newest checkpoint in out_dir
    outputs: dict[str, Path] = field(default_factory=dict)  # earlier stages' checkpoints, by name
    log: Callable[..., None] = print
    run_id: str | None = None             # the run identity (forge.rundir); resume continues only its checkpoints
    parallelism: Parallelism | str = "ddp"  # a strategy name stands for its defaults (forge.train.parallel)
    flops: Flops | None = None            # for tokens/s -> MFU per log window
    base: Path | None = None              # the pipeline's first checkpoint (SFT's replay_teacher: base)
