"""What `forge run` says of its plan: one plain line per stage (steps, the time predicted here and
on the recipe's own target), with the local rate it used (a calibration file, a measurement of
this machine made now or cached in the output folder, or the uncalibrated guess); the full
table stays `forge plan`'s."""
from __future__ import annotations

from typing import Callable

from forge.plan.planner import StagePlan
from forge.plan.recipe_plan import local_rate, plan_recipe, recipe_catalog
from forge.plan.report import stage_lines


def run_plans(recipe, recipe_path: str, log: Callable[[str], None], measure: bool = True
              ) -> tuple[list[StagePlan], list[str]]:
    """(the plans on the recipe's own target, each local one at the rate in use; the lines to print).
    `log` says when this machine is being measured (a few seconds a stage, once: it is cached)."""
    cat = recipe_catalog(recipe)
    rate = local_rate(recipe, cat, measure, log)
    # here it runs as one process: steps of one process's batch, whatever chips the recipe's target has
    alone = recipe.model_copy(update={"compute": recipe.compute.model_copy(update={"target": "local", "chips": None})})
    local = plan_recipe(alone, catalog=cat, local=rate)
    own = plan_recipe(recipe, catalog=cat, local=rate)
    lines = [f"plan: {line}" for line in stage_lines(local, own, rate.tag)]
    lines.append(f"  local rate {rate.text}; the full table: forge plan {recipe_path}")
    return own, lines
