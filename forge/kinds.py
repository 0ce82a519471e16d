"""Stage kinds: the ONE table of what each kind is. A row names the kind's settings class, the stage
module that runs it, the shape of data it reads, the planner's workload builder, what the
evaluation suite measures for it and the headline figure the end-of-run summary shows for it;
nothing else in forge compares kind names.

Adding a kind is one settings class (a StageSettings with `kind: Literal["NAME"]`, which the recipe
then accepts), one stage file holding `run(stage, inputs) -> StageResult` and one row below. The
row's `data` and `evaluates` are read from the settings class (its `reads` and `evaluates`), so the
recipe's validators and the table cannot disagree. Modules and workload builders are dotted names,
imported on demand: stage modules pull in torch, and the planner sits above this table.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable

from forge.recipe.registry import StageSettings, kind_name
from forge.recipe.rft_settings import RftStage
from forge.recipe.settings import DpoStage, MidtrainStage, PretrainStage, SftStage, SoupStage, TrainSettings


def _resolve(dotted: str) -> Any:
    module, _, attr = dotted.partition(":")
    return getattr(importlib.import_module(module), attr)


@dataclass(frozen=True)
class Headline:
    """A stage's headline figure in the end-of-run summary (forge.eval.summary): the key of its
    result's metrics (the value when the stage began, where the loop measured it, under
    `<metric>_start`), what the summary calls it, and whether it is a rate shown as a percentage."""

    metric: str
    label: str
    percent: bool = False
    prefer: Headline | None = None  # shown instead where the stage measured it (an env's held-out reward)


EVAL_LOSS = Headline("eval_loss", "eval loss")


@dataclass(frozen=True)
class Kind:
    settings: type[StageSettings]
    module: str                 # holds run(stage, inputs) -> StageResult
    workload: str | None        # "module:builder" (forge.plan.workloads.Builder); None: nothing to plan
    headline: Headline = EVAL_LOSS  # the figure its row of the end-of-run summary shows

    @property
    def name(self) -> str:
        return kind_name(self.settings) or ""

    @property
    def data(self) -> str:
        """The shape of the records it reads: text, chat, preference or prompts."""
        return self.settings.reads

    @property
    def evaluates(self) -> tuple[str, ...]:
        """What the evaluation suite measures for it: perplexity, preference, reward."""
        return self.settings.evaluates

    def runner(self) -> Callable:
        return _resolve(f"{self.module}:run")

    def builder(self) -> Any:
        """The planner's workload builder (from_stage, from_args), or None for a kind that does not train."""
        return _resolve(self.workload) if self.workload else None


def _rows(*rows: Kind) -> dict[str, Kind]:
    return {row.name: row for row in rows}


KINDS: dict[str, Kind] = _rows(
    Kind(PretrainStage, "forge.stages.pretrain", "forge.plan.workloads:LM", EVAL_LOSS),
    Kind(MidtrainStage, "forge.stages.pretrain", "forge.plan.workloads:LM", EVAL_LOSS),
    Kind(SoupStage, "forge.stages.soup", None, Headline("ingredients", "ingredients averaged")),
    Kind(SftStage, "forge.stages.sft", "forge.plan.workloads:SFT", EVAL_LOSS),
    Kind(DpoStage, "forge.stages.dpo", "forge.plan.workloads:DPO",
         Headline("eval_rewards/accuracy", "preference accuracy", percent=True)),
    Kind(RftStage, "forge.stages.rft", "forge.plan.workloads:RFT",
         Headline("reward_mean", "mean reward", prefer=Headline("env.heldout.reward", "held-out trajectory reward"))),
)


def row(stage: StageSettings) -> Kind:
    """The table's row for a stage's settings."""
    return KINDS[stage.kind]


def trains(stage: StageSettings) -> bool:
    """Whether the stage runs a training loop (and so has a plan, steps and tokens)."""
    return isinstance(stage, TrainSettings)
