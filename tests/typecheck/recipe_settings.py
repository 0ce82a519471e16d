"""Checked by mypy, never run: the recipe's settings classes are assignable to the Protocols the
training core reads them through (forge.train never imports the recipe, so it cannot check this
itself): every training kind to TrainSettings, and each block to its own Protocol."""
from __future__ import annotations

from forge.recipe import rft_settings, schema, settings as recipe
from forge.train import settings as train


def kinds(base: recipe.TrainSettings, pretrain: recipe.PretrainStage, midtrain: recipe.MidtrainStage,
          sft: recipe.SftStage, dpo: recipe.DpoStage, rft: rft_settings.RftStage) -> list[train.TrainSettings]:
    return [base, pretrain, midtrain, sft, dpo, rft]


def blocks(optim: recipe.Optim, schedule: recipe.Schedule, guard: recipe.Guard,
           checkpoint: recipe.CheckpointSettings, evaluation: recipe.EvalSettings, lora: recipe.Lora
           ) -> tuple[train.OptimSettings, train.ScheduleSettings, train.GuardSettings, train.CheckpointSettings,
                      train.Cadence, train.LoraSettings]:
    return optim, schedule, guard, checkpoint, evaluation, lora


def launch(parallelism: schema.Parallelism, context: recipe.ContextExtension, scaling: recipe.RopeScaling
           ) -> tuple[train.ParallelismSettings, train.ContextSettings, train.RopeScalingSettings]:
    return parallelism, context, scaling
