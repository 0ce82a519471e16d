"""forge.plan: what a stage will cost and whether it fits, from a model's config.json alone.

Hardware catalog (hardware.yaml + user overrides), model math (parameters, FLOPs, memory),
training stacks (stacks.yaml), per-stage plans with a parallel layout and an error band, published
anchor runs replayed (anchors.yaml), comparisons across targets, calibration of the local machine,
and the `forge plan` command (command.py).
"""
from forge.plan.anchors import error_band, replay_all
from forge.plan.calibrate import calibrate, comparison_metrics, fit_calibration, predict_local_step, record_measurement
from forge.plan.flops import forward_flops_per_token, palm_flops_per_token, training_flops_per_token
from forge.plan.hardware import get_system, known_targets, load_catalog, system_totals
from forge.plan.model import ModelSpec, count_parameters, load_model_config, spec_from_config
from forge.plan.planner import StagePlan, compare, plan_stage
from forge.plan.recipe_plan import plan_recipe, stage_workload
from forge.plan.report import assert_plans_fit, format_table, plan_tracking_payload, plot_plans, to_json

__all__ = [
    "ModelSpec", "StagePlan", "assert_plans_fit", "calibrate", "compare", "comparison_metrics",
    "count_parameters", "error_band", "fit_calibration", "format_table", "forward_flops_per_token", "get_system",
    "known_targets", "load_catalog", "load_model_config", "palm_flops_per_token", "plan_recipe",
    "plan_stage", "plan_tracking_payload", "plot_plans", "predict_local_step", "record_measurement",
    "replay_all", "spec_from_config", "stage_workload", "system_totals", "to_json", "training_flops_per_token",
]
