"""Per-stage bookkeeping, the same for every stage kind: the stage's MLflow child run (reopened
when a stage resumes), its params, plan and datasets, reuse of a stage that finished in an
earlier run, predicted vs measured compute, and its lineage record."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from forge.inputs import Inputs
from forge.kinds import KINDS, trains
from forge.lineage import MergeRecord, StageRecord
from forge.plan.device_peak import flops_per_token, peak_flops_for_device
from forge.plan.record import log_measured, log_plan_chart, log_stage_plan
from forge.rundir import RunLayout
from forge.stages.result import StageInputs, StageResult
from forge.track.notes import stage_note
from forge.track.protocol import Tracker
from forge.track.runs import RunIds
from forge.train.accel import device_name, process_state
from forge.train.checkpoint import finished_result
from forge.train.memory import peak_rss_mb, reset_peak_rss
from forge.train.meter import Flops


@dataclass
class Planned:
    """What the planner said before the run, for predicted vs measured."""

    plans: dict[str, Any] = field(default_factory=dict)       # stage name -> StagePlan on the recipe's target
    comparison: dict[str, list[Any]] = field(default_factory=dict)  # stage name -> [StagePlan] on reference targets
    model_config: dict[str, Any] = field(default_factory=dict)


@dataclass
class RunPlace:
    """Where the run writes and which run it is."""

    out: Path
    run_id: str | None = None   # the run identity (forge.rundir): resume continues only its checkpoints
    resume: bool = False
    parallelism: Any = "ddp"    # the recipe's parallelism: block (or a strategy name): how stages train and save

    @property
    def layout(self) -> RunLayout:
        return RunLayout(self.out)


@dataclass
class PipelineState:
    """What every stage's bookkeeping needs from the pipeline."""

    tracker: Tracker
    inputs: Inputs
    place: RunPlace
    planned: Planned
    runs: RunIds
    single_process_main: bool = True  # rank 0 of a one-process run: measure against the local plan
    outputs: dict[str, Path] = field(default_factory=dict)  # finished stages' checkpoints
    log: Callable[[str], None] = print


def run_stage(index: int, stage: Any, checkpoint: Path, p: PipelineState) -> tuple[StageResult, StageRecord]:
    """Run (or reuse) one stage inside its child run; return its result and lineage record."""
    tracker, stage_dir, resume = p.tracker, p.place.layout.stage(stage.name), p.place.resume
    final = p.place.layout.stage_final(stage.name)
    done = finished_result(final) if resume else None
    if done is not None and p.runs.reopened and stage.name in p.runs.stages:
        p.log("  finished in an earlier run: reusing its checkpoint (and its MLflow run)")
        result = StageResult.from_dict(done)
        merged = _merge_back(stage, checkpoint, result, p.place)
    else:
        run_id = p.runs.stages.get(stage.name) if p.runs.reopened else None
        tags = {"forge.stage": stage.kind, "forge.stage_index": str(index)}
        with tracker.run(stage.name, tags=tags, run_id=run_id) as child:
            if child and child != run_id:
                p.runs.stages[stage.name] = child
                p.runs.save()
                _log_setup(stage, checkpoint, p)
            if done is not None:
                p.log("  finished in an earlier run: reusing its checkpoint")
                tracker.set_tags({"reused": str(final)})
                result = StageResult.from_dict(done)
            else:
                inputs = StageInputs(checkpoint, p.inputs.sources, stage_dir, tracker, resume=resume,
                                     outputs=dict(p.outputs), log=p.log, run_id=p.place.run_id,
                                     parallelism=p.place.parallelism, flops=_flops(stage, p), base=p.inputs.base)
                reset_peak_rss()
                result = KINDS[stage.kind].runner()(stage, inputs)
                result.metrics["peak_rss_mb"] = peak_rss_mb()  # this process's, while the stage trained
            tracker.log_summary("final", result.metrics)
            if trains(stage) and p.single_process_main and "step_time_s" in result.metrics:
                log_measured(tracker, p.planned.model_config, stage, result.steps, result.metrics, stage_dir,
                             p.planned.plans.get(stage.name))
                if stage.name in p.planned.plans and "train_seconds" in result.metrics:  # the chart, with what ran
                    plan = p.planned.plans[stage.name]
                    log_plan_chart(tracker, plan, p.planned.comparison.get(stage.name, []),
                                   {plan.target: result.metrics["train_seconds"] / 3600})
            merged = _merge_back(stage, checkpoint, result, p.place)
            tracker.describe(stage_note(stage, checkpoint, result, p.planned.plans.get(stage.name), merged))
    p.outputs[stage.name] = result.checkpoint
    record = StageRecord(name=stage.name, kind=stage.kind, settings=stage.model_dump(mode="json"),
                         input_checkpoint=str(checkpoint), output_checkpoint=str(result.checkpoint),
                         steps=result.steps, tokens_by_source=result.tokens_by_source, metrics=result.metrics,
                         merge=merged, extras=dict(result.lineage))
    return result, record


def _flops(stage: Any, p: PipelineState) -> Flops | None:
    """The model's FLOPs per trained token and this process's chip peak, for MFU per log window
    (None for a model the planner cannot count). FSDP's bf16 mixed precision computes in bf16."""
    if not trains(stage) or not p.planned.model_config:
        return None
    per_token = flops_per_token(p.planned.model_config, stage.seq_len)
    if per_token is None:
        return None
    mixed = getattr(p.place.parallelism, "mixed_precision", "none") == "bf16"
    precision = "bf16" if mixed else stage.precision
    return Flops(per_token, peak_flops_for_device(device_name(process_state().device), precision))


def _merge_back(stage: Any, checkpoint: Path, result: StageResult, place: RunPlace) -> MergeRecord | None:
    """With `merge: {weight}`, the stage's output becomes its interpolation toward the input weights
    (written through the strategy's checkpointer); returns what the lineage records of it."""
    cfg = getattr(stage, "merge", None)
    if cfg is None:
        return None
    from forge.train.parallel import checkpointer

    trained, out = result.checkpoint, place.layout.stage_merged(stage.name)
    checkpointer(place.parallelism, process_state()).merge_back(trained, checkpoint, cfg.weight, out)
    result.checkpoint = out
    return MergeRecord(weight=cfg.weight, trained_checkpoint=str(trained), input_checkpoint=str(checkpoint),
                       output_checkpoint=str(out))


def _log_setup(stage: Any, checkpoint: Path, p: PipelineState) -> None:
    tracker = p.tracker
    tracker.log_params(stage.model_dump(mode="json"))
    tracker.log_params({"input_checkpoint": str(checkpoint)})
    if stage.name in p.planned.plans:
        log_stage_plan(tracker, p.planned.plans[stage.name], p.planned.comparison.get(stage.name, []))
    for name, weight in stage.sources.items():
        raw = p.inputs.raw[name]
        tracker.log_dataset(name, raw.location, p.inputs.fingerprints[name], tags={"weight": str(weight)})
