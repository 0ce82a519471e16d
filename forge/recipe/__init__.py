"""The recipe: a typed schema validated once at load time (schema.py), the per-stage settings
(settings.py; the rft stage's in rft_settings.py) and their registry by kind (registry.py), data
sources (data.py), the evaluation block (eval.py), the safe YAML reader (yaml.py) and error
reporting with dotted overrides (errors.py). Import the public names from here."""
from __future__ import annotations

from forge.recipe.data import NAME, DataSource, GeneratedText, Strict
from forge.recipe.eval import EvalBlock, FactRecall, Gates, LmEval, MeanReward, Preference
from forge.recipe.registry import SETTINGS, AnyStage, StageSettings, kind_name, stage_kinds
from forge.recipe.rft_settings import RewardSource, RftStage
from forge.recipe.schema import (
    MODEL_NAME,
    Base,
    Compute,
    Parallelism,
    Recipe,
    ScratchBase,
    Stage,
    Tracking,
    load_recipe,
    resolve_paths,
    resolved_yaml,
)
from forge.recipe.settings import (
    CheckpointSettings,
    ContextExtension,
    DpoStage,
    EvalSettings,
    Guard,
    Lora,
    MergeBack,
    MidtrainStage,
    NovaMixture,
    Optim,
    PostTrainSettings,
    PretrainStage,
    RopeScaling,
    Samples,
    Schedule,
    SftStage,
    SoupStage,
    TrainSettings,
)

__all__ = [
    "NAME", "DataSource", "GeneratedText", "Strict",
    "EvalBlock", "FactRecall", "Gates", "LmEval", "MeanReward", "Preference",
    "SETTINGS", "AnyStage", "StageSettings", "kind_name", "stage_kinds",
    "MODEL_NAME", "Base", "Compute", "Parallelism", "Recipe", "ScratchBase", "Stage", "Tracking",
    "load_recipe", "resolve_paths", "resolved_yaml",
    "CheckpointSettings", "ContextExtension", "DpoStage", "EvalSettings", "Guard", "Lora", "MergeBack",
    "MidtrainStage", "NovaMixture", "Optim", "PostTrainSettings", "PretrainStage", "RewardSource", "RftStage",
    "RopeScaling", "Samples", "Schedule", "SftStage", "SoupStage", "TrainSettings",
]
