"""Thin adapter from a forge recipe to planner workloads: `plan_recipe(recipe, ...)`.

Each stage's typed settings become a workload through its row of the kinds table (forge/kinds.py);
stages that do not train (a soup) have no workload and no plan.
"""
from __future__ import annotations

from dataclasses import replace

from forge import catalog
from forge.errors import ForgeError
from forge.kinds import row
from forge.plan import workloads as W
from forge.plan.hardware import load_catalog, parse_targets
from forge.plan.model import load_model_config
from forge.plan.planner import Goal, Setup, StagePlan, compare


def recipe_model_config(recipe) -> dict:
    base = recipe.base
    if hasattr(base, "scratch") and hasattr(base.scratch, "hf_config"):
        base = base.scratch                        # forge.recipe.Base wraps the scratch model
    if hasattr(base, "hf_config"):
        return dict(base.hf_config())
    for attr in ("path", "checkpoint"):            # a typed base may wrap the path
        if hasattr(base, attr) and isinstance(getattr(base, attr), str):
            base = getattr(base, attr)
    if not isinstance(base, str):
        raise ForgeError("recipe.base must be a checkpoint path or a model built from a config")
    if catalog.is_ref(base):  # its folder once on disk, else the preset the catalog names for it
        return load_model_config(catalog.planning_config(base))
    return load_model_config(base)


def stage_workload(stage, dp_world: int = 1, precision: str | None = None) -> W.Workload | None:
    """One recipe stage as a Workload (None for a stage that does not train).
    Global batch = batch_size * grad_accum * dp_world."""
    build = row(stage).builder()
    return build.from_stage(stage, dp_world, precision) if build is not None else None


def plan_recipe(recipe, target: str | None = None, goal: Goal = Goal(), setup: Setup = Setup(),
                precision: str | None = None, catalog: dict | None = None) -> list[StagePlan]:
    """Plan every training stage of `recipe` on `target` (default: recipe.compute.target; a comma
    list 'trn3,trn2,h100:64' compares several). goal.chips, else a target's own count, else the
    recipe's compute.chips on its own target; setup.stack, else the recipe's compute.stack.
    Returns one StagePlan per (stage, target)."""
    compute = getattr(recipe, "compute", None)
    own_target = getattr(compute, "target", None) or "local"
    own_chips = getattr(compute, "chips", None)
    calibration = getattr(compute, "calibration", None)      # applied only where the recipe asks
    catalog = catalog if catalog is not None else load_catalog((calibration,) if calibration else ())
    config = recipe_model_config(recipe)
    targets = parse_targets(target or own_target)
    setup = replace(setup, stack=setup.stack or getattr(compute, "stack", None))
    plans = []
    for stage in recipe.stages:
        wl = stage_workload(stage, own_chips or 1, precision)
        if wl is None:
            continue
        for name, per_target_chips in targets:
            n = goal.chips or per_target_chips or (own_chips if name == own_target else None)
            plans += compare(config, wl, [(name, n)], goal, setup, catalog)
    return plans
