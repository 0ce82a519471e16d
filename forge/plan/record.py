"""What a running pipeline records about its plan: the plan and a cross-target chart before a
stage, predicted vs measured step time / tokens/s / peak memory after it (also kept for
`forge plan --calibrate`). Takes a tracker object; only forge/track/ talks to MLflow."""
from __future__ import annotations

import tempfile
from pathlib import Path

from forge.plan.calibrate import comparison_metrics, predict_local_step, record_measurement
from forge.plan.planner import StagePlan
from forge.plan.report import plan_tracking_payload, plot_plans

# the reference comparison for every stage's chart: Trainium3 vs Trainium2 vs NVIDIA nodes
COMPARE_TARGETS = "trn3-ultraserver,trn2-ultraserver,p5.48xlarge,p5en.48xlarge,p6-b200.48xlarge"


def log_stage_plan(tracker, plan: StagePlan, comparison: list[StagePlan]) -> None:
    params, metrics, artifacts = plan_tracking_payload(plan)
    tracker.log_params(params)
    tracker.log_summary("plan", {k.removeprefix("plan."): v for k, v in metrics.items()})
    for name, data in artifacts.items():
        tracker.log_bytes(data, f"plan/{name}")
    log_plan_chart(tracker, plan, comparison)


def log_plan_chart(tracker, plan: StagePlan, comparison: list[StagePlan], measured_hours: dict | None = None) -> None:
    """plan/plan_targets.png: the stage's plan across targets (and what it measured, once it has)."""
    with tempfile.TemporaryDirectory() as tmp:
        tracker.log_artifact(plot_plans([plan, *comparison], Path(tmp) / "plan_targets.png", measured_hours), "plan")


def log_measured(tracker, model_config: dict, stage, steps: int, metrics: dict, run_dir,
                 plan: StagePlan | None = None) -> dict:
    """Compare the planner's local prediction (the run's own local `plan`, at the rate it used:
    calibrated, measured or the guess; else the uncalibrated one) with what the stage measured;
    record it for calibration in `run_dir` (the stage's output folder), never in a machine-wide file."""
    predicted = predict_local_step(model_config, stage.seq_len, stage.batch_size, stage.grad_accum, stage.precision)
    if plan is not None and plan.target == "local" and plan.feasible and plan.step_time_s:
        predicted.update(step_time_s=plan.step_time_s, tokens_per_s=predicted["tokens_per_step"] / plan.step_time_s,
                         calibrated=bool(plan.band_basis) and not plan.band_basis.startswith("uncalibrated"),
                         rate=plan.band_basis)
    measured = {"step_time_s": metrics["step_time_s"], "tokens_per_s": metrics["tokens_per_s_mean"],
                "peak_mem_bytes": metrics["peak_mem_bytes"], "flops_per_step": predicted["flops_per_step"],
                "precision": stage.precision, "steps": steps}
    figures = comparison_metrics(predicted, measured)
    tracker.log_summary("plan", {k.removeprefix("plan."): v for k, v in figures.items()})
    record_measurement(run_dir, predicted, measured, stage=stage.name, kind=stage.kind,
                       model=model_config.get("model_type", "?"))
    return figures
