"""The contract between `forge run` and a pipeline: a module pipelines/NAME.py, loaded by the name a
recipe's `pipeline:` gives (forge/cli.py), whose `run(ctx)` runs the recipe with the one
PipelineContext `forge run` makes and returns its result (pipelines.novella's PipelineResult, whose
fields the run's summary reads: forge.eval.summary.ending)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Protocol

if TYPE_CHECKING:  # types only: a pipeline's context is made after these are loaded
    from forge.plan.stage_plan import StagePlan
    from forge.recipe import Recipe
    from forge.rundir import RunFolder
    from forge.track.protocol import Tracker


@dataclass(frozen=True)
class PipelineContext:
    """What a pipeline runs with: made once by `forge run`, before the pipeline's first output."""

    recipe: Recipe
    tracker: Tracker                   # rank 0's records; the other ranks' is disabled
    plans: dict[str, StagePlan] = field(default_factory=dict)             # stage name -> its plan, recipe's target
    comparison: dict[str, list[StagePlan]] = field(default_factory=dict)  # stage name -> plans on reference targets
    log: Callable[[str], None] = print  # what the pipeline says (rank 0: the terminal and OUTPUT/forge.log)
    resume: bool = False               # reuse finished stages, continue an interrupted one from its checkpoint
    folder: RunFolder | None = None    # the run folder `forge run` holds: run identity, input fingerprints


class Pipeline(Protocol):
    """A pipeline module as `forge run` uses it."""

    def run(self, ctx: PipelineContext) -> Any: ...
