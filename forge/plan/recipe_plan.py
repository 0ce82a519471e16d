"""Thin adapter from a forge recipe to planner workloads: `plan_recipe(recipe, ...)`, and the
local rate it plans with (`local_rate`: a calibration file, else each stage measured here).

Each stage's typed settings become a workload through its row of the kinds table (forge/kinds.py);
stages that do not train (a soup) have no workload and no plan.
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Callable

from forge import catalog
from forge.errors import ForgeError
from forge.kinds import row
from forge.plan import workloads as W
from forge.plan.calibrate import LOCAL_CHIP
from forge.plan.hardware import get_system, load_catalog, parse_targets
from forge.plan.local_rate import LocalRate, calibration_file, measured, name_calibration
from forge.plan.measure import Shape
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


def recipe_catalog(recipe, hardware: tuple = (), calibration: str | None = None) -> dict:
    """The hardware catalog a recipe plans with: the built-in one, `hardware` files, and the
    calibration `calibration` names, else the recipe's (compute.calibration, else
    OUTPUT/calibration.yaml); the local chip's calibration says which file it came from."""
    found = Path(calibration) if calibration else calibration_file(recipe)
    cat = load_catalog(tuple(hardware) + ((found,) if found is not None else ()))
    return name_calibration(cat, f"calibrated from {found}") if found is not None else cat


def stage_shapes(recipe, precision: str | None = None) -> dict[str, Shape]:
    """Each training stage's step shape (sequences per micro-batch, micro-batches per step) on one process."""
    shapes = {}
    for stage in recipe.stages:
        wl = stage_workload(stage, 1, precision)
        if wl is not None:
            accum = int(getattr(stage, "grad_accum", 1) or 1)
            shapes[stage.name] = Shape(wl.seq_len, max(1, wl.global_batch // accum), accum, wl.precision)
    return shapes


def local_rate(recipe, cat: dict, measure: bool = True, log: Callable[[str], None] = print,
               precision: str | None = None) -> LocalRate:
    """The rate plans on `local` use: the calibration `cat` holds (a file), else each stage measured
    here (cached in the recipe's output folder), else (measure=False, or too large) uncalibrated."""
    cal = cat.get("chips", {}).get(LOCAL_CHIP, {}).get("calibration") or {}
    if cal.get("effective_tflops"):
        return LocalRate("calibrated", str(cal.get("source") or "calibrated"))
    if not measure:
        return LocalRate()
    return measured(recipe_model_config(recipe), stage_shapes(recipe, precision), Path(recipe.output), log)


def plan_recipe(recipe, target: str | None = None, goal: Goal = Goal(), setup: Setup = Setup(),
                precision: str | None = None, catalog: dict | None = None,
                local: LocalRate | None = None) -> list[StagePlan]:
    """Plan every training stage of `recipe` on `target` (default: recipe.compute.target; a comma
    list 'trn3,trn2,h100:64' compares several). goal.chips, else a target's own count, else the
    recipe's compute.chips on its own target; setup.stack, else the recipe's compute.stack; the
    catalog, else recipe_catalog's; on the local target, each stage at `local`'s rate.
    Returns one StagePlan per (stage, target)."""
    compute = getattr(recipe, "compute", None)
    own_target = getattr(compute, "target", None) or "local"
    own_chips = getattr(compute, "chips", None)
    cat = catalog if catalog is not None else recipe_catalog(recipe)
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
            here = local is not None and get_system(name, cat).chip.key == LOCAL_CHIP
            plans += compare(config, wl, [(name, n)], goal, setup, local.catalog_for(cat, stage.name) if here else cat)
    return plans
