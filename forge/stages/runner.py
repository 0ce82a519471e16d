"""Per-stage bookkeeping, the same for every stage kind: the stage's MLflow child run (reopened
when a stage resumes), its params, plan and datasets, reuse of a stage that finished in an
earlier run, predicted vs measured compute, and its lineage record."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from forge.inputs import Inputs
from forge.plan.runlog import log_measured, log_plan_chart, log_stage_plan
from forge.kinds import KINDS, trains
from forge.stages.result import StageInputs, StageResult
from forge.story import stage_note
from forge.train.checkpoint import finished_result
from forge.train.memory import peak_rss_mb, reset_peak_rss

RUNS_FILE = "tracking.json"  # the output folder's MLflow run ids: {"parent": id, "stages": {name: id}}


@dataclass
class RunIds:
    """Which MLflow runs belong to this output folder, so a resume continues them."""

    path: Path
    parent: str | None = None
    stages: dict[str, str] = field(default_factory=dict)
    reopened: bool = False  # the parent run was reopened (not a new one)

    @classmethod
    def load(cls, out: Path) -> "RunIds":
        path = out / RUNS_FILE
        data = json.loads(path.read_text()) if path.is_file() else {}
        return cls(path, data.get("parent"), dict(data.get("stages", {})))

    def save(self) -> None:
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps({"parent": self.parent, "stages": self.stages}, indent=2))
        tmp.replace(self.path)

    def reopenable(self, tracker) -> str | None:
        """The parent run to continue, or None for a new one. A run still RUNNING belongs to a
        process that was killed without a clean stop: it and its stages' runs are marked FAILED."""
        status = tracker.run_status(self.parent) if self.parent else None
        if status == "RUNNING":
            for run_id in [self.parent, *self.stages.values()]:
                if tracker.run_status(run_id) == "RUNNING":
                    tracker.end_stale(run_id, "the process was killed (no clean stop); marked when the run resumed")
            return None
        self.reopened = status is not None
        return self.parent if self.reopened else None

    def discard(self, tracker) -> None:
        """A fresh run in this folder: the runs an earlier, killed process left RUNNING are marked
        FAILED, and the ids of the earlier runs are forgotten."""
        for run_id in [self.parent, *self.stages.values()]:
            if run_id and tracker.run_status(run_id) == "RUNNING":
                tracker.end_stale(run_id, "the process was killed (no clean stop); marked when a new run started")
        self.parent, self.stages = None, {}


@dataclass
class PipelineState:
    """What every stage's bookkeeping needs from the pipeline."""

    tracker: object
    inputs: Inputs
    out: Path
    plans: dict                 # stage name -> StagePlan on the recipe's target
    comparison: dict            # stage name -> [StagePlan] on the reference targets
    model_config: dict
    runs: RunIds
    resume: bool = False
    single_process_main: bool = True  # rank 0 of a one-process run: measure against the local plan
    outputs: dict[str, Path] = field(default_factory=dict)  # finished stages' checkpoints
    log: Callable = print
    run_id: str | None = None   # the run identity (forge.rundir): resume continues only its checkpoints


def run_stage(index: int, stage, checkpoint: Path, p: PipelineState) -> tuple[StageResult, dict]:
    """Run (or reuse) one stage inside its child run; return its result and lineage record."""
    tracker, stage_dir = p.tracker, p.out / "stages" / stage.name
    done = finished_result(stage_dir / "final") if p.resume else None
    if done is not None and p.runs.reopened and stage.name in p.runs.stages:
        p.log("  finished in an earlier run: reusing its checkpoint (and its MLflow run)")
        result = StageResult.from_dict(done)
        merged = _merge_back(stage, checkpoint, result, stage_dir)
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
                tracker.set_tags({"reused": str(stage_dir / "final")})
                result = StageResult.from_dict(done)
            else:
                inputs = StageInputs(checkpoint, p.inputs.sources, stage_dir, tracker, p.resume, dict(p.outputs), p.log,
                                     p.run_id)
                reset_peak_rss()
                result = KINDS[stage.kind].runner()(stage, inputs)
                result.metrics["peak_rss_mb"] = peak_rss_mb()  # this process's, while the stage trained
            tracker.log_summary("final", result.metrics)
            if trains(stage) and p.single_process_main and "step_time_s" in result.metrics:
                log_measured(tracker, p.model_config, stage, result.steps, result.metrics, stage_dir)
                if stage.name in p.plans and "train_seconds" in result.metrics:  # the chart, now with what ran
                    plan = p.plans[stage.name]
                    log_plan_chart(tracker, plan, p.comparison.get(stage.name, []),
                                   {plan.target: result.metrics["train_seconds"] / 3600})
            merged = _merge_back(stage, checkpoint, result, stage_dir)
            tracker.describe(stage_note(stage, checkpoint, result, p.plans.get(stage.name), merged.get("merge")))
    p.outputs[stage.name] = result.checkpoint
    record = {"name": stage.name, "kind": stage.kind, "settings": stage.model_dump(mode="json"),
              "input_checkpoint": str(checkpoint), "output_checkpoint": str(result.checkpoint),
              "steps": result.steps, "tokens_by_source": result.tokens_by_source, "metrics": result.metrics,
              **result.lineage, **merged}
    return result, record


def _merge_back(stage, checkpoint: Path, result: StageResult, stage_dir: Path) -> dict:
    """With `merge: {weight}`, the stage's output becomes its interpolation toward the input weights
    (rank 0 writes it); returns what the lineage records of it."""
    cfg = getattr(stage, "merge", None)
    if cfg is None:
        return {}
    from forge.train.accel import process_state
    from forge.train.merge import merge_back

    state, trained, out = process_state(), result.checkpoint, stage_dir / "merged"
    if state.is_main_process:
        merge_back(trained, checkpoint, cfg.weight, out)
    state.wait_for_everyone()
    result.checkpoint = out
    return {"merge": {"weight": cfg.weight, "trained_checkpoint": str(trained), "input_checkpoint": str(checkpoint),
                      "output_checkpoint": str(out)}}


def _log_setup(stage, checkpoint: Path, p: PipelineState) -> None:
    tracker = p.tracker
    tracker.log_params(stage.model_dump(mode="json"))
    tracker.log_params({"input_checkpoint": str(checkpoint)})
    if stage.name in p.plans:
        log_stage_plan(tracker, p.plans[stage.name], p.comparison.get(stage.name, []))
    for name, weight in stage.sources.items():
        raw = p.inputs.raw[name]
        tracker.log_dataset(name, raw.location, p.inputs.fingerprints[name], tags={"weight": str(weight)})
