"""Stage kinds: the ONE table of what each kind is (settings class, stage module, planner workload).

The recipe schema builds `stages[i]` from it, the pipeline finds a stage's `run` through it, and the
planner turns a stage's typed settings into a workload with it. Adding a kind means one settings
class (forge/recipe/settings.py), one stage file, one workload function here, and one row below.

A stage is `run(stage, inputs: StageInputs) -> StageResult` (forge/stages/result.py): it takes a
checkpoint, data and settings and returns a checkpoint and metrics; it never knows its neighbours.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable

from forge.plan import workloads as W
from forge.recipe.settings import DpoStage, MidtrainStage, PretrainStage, RftStage, SftStage, SoupStage, TrainSettings


def _lm_workload(stage: PretrainStage, dp_world: int, precision: str | None) -> W.Workload:
    """Causal-LM training over packed blocks: every token trained (pretrain and midtrain)."""
    batch = stage.batch_size * stage.grad_accum * max(1, dp_world)
    return W.pretrain(stage.name, stage.seq_len, batch, stage.max_tokens, stage.max_steps,
                      precision or stage.precision, kind=stage.kind)


def _sft_workload(stage: SftStage, dp_world: int, precision: str | None) -> W.Workload:
    """SFT: packed blocks (padding only inside a block's tail), or batches padded per batch."""
    batch = stage.batch_size * stage.grad_accum * max(1, dp_world)
    return W.sft(stage.name, stage.seq_len, batch, stage.max_tokens, stage.max_steps, precision or stage.precision,
                 packed=stage.packing == "best_fit")


def _dpo_workload(stage: DpoStage, dp_world: int, precision: str | None) -> W.Workload:
    """DPO: chosen and rejected through the policy; the reference once up front (cached) or every step."""
    pairs = stage.batch_size * stage.grad_accum * max(1, dp_world)
    return W.dpo(stage.name, stage.seq_len, pairs, steps=stage.total_steps(max(1, dp_world)),
                 precision=precision or stage.precision, cached_reference=stage.reference == "cached")


def _rft_workload(stage: RftStage, dp_world: int, precision: str | None) -> W.Workload:
    """GRPO: `group` completions of max_new_tokens per prompt each step, then one update on them."""
    prompts = stage.batch_size * stage.grad_accum * max(1, dp_world)
    return W.rft(stage.name, stage.seq_len, stage.max_new_tokens, prompts, stage.group,
                 stage.total_steps(max(1, dp_world)), precision or stage.precision)


@dataclass(frozen=True)
class Kind:
    settings: type
    module: str  # holds run(stage, inputs) -> StageResult; imported on demand (torch is heavy)
    workload: Callable[[object, int, str | None], W.Workload] | None  # None: no training to plan

    def runner(self):
        return importlib.import_module(self.module).run


KINDS: dict[str, Kind] = {
    "pretrain": Kind(PretrainStage, "forge.stages.pretrain", _lm_workload),
    "midtrain": Kind(MidtrainStage, "forge.stages.pretrain", _lm_workload),
    "soup": Kind(SoupStage, "forge.stages.soup", None),
    "sft": Kind(SftStage, "forge.stages.sft", _sft_workload),
    "dpo": Kind(DpoStage, "forge.stages.dpo", _dpo_workload),
    "rft": Kind(RftStage, "forge.stages.rft", _rft_workload),
}


def kind(stage) -> Kind:
    return KINDS[stage.kind]


def trains(stage) -> bool:
    """Whether the stage runs a training loop (and so has a plan, steps and tokens)."""
    return isinstance(stage, TrainSettings)
