"""The Novella pipeline: base -> stage -> stage -> ... -> Novella folder, registered in MLflow.

Runs the recipe's stages in order, each stage's output checkpoint feeding the next, inside one
parent MLflow run with a child run per stage (forge.stages.runner), and writes the final model
with its lineage; then evaluates it against the starting checkpoint, checks the gates, writes
its model card and registers it (forge.eval.finish). With `eval.after_each_stage`, each stage's
output is evaluated as soon as the stage ends (forge.eval.stage_eval).

    forge run recipes/quickstart.yaml
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from forge import catalog
from forge.eval.finish import Evaluation, NovellaRun, finish_novella
from forge.eval.stage_eval import StageEvaluator
from forge.eval.summary import duration, stage_figure
from forge.inputs import input_fingerprints, prepare_inputs
from forge.kinds import row
from forge.lineage import Lineage, base_spec, new_lineage, source_record, write_novella
from forge.pipeline import PipelineContext
from forge.plan.recipe_plan import recipe_model_config
from forge.recipe import Recipe, resolved_yaml
from forge.recipe.eval import higher_is_better
from forge.rundir import RESOLVED, RunLayout
from forge.runlog import append, log_path
from forge.stages.runner import PipelineState, Planned, RunPlace, run_stage
from forge.track.notes import base_summary, pipeline_note, stage_row
from forge.track.protocol import Tracker
from forge.track.runs import parent_run
from forge.track.story import log_story
from forge.train.accel import process_state
from forge.train.checkpoint import finished_result
from forge.train.memory import peak_rss_mb, reset_peak_rss


@dataclass
class PipelineResult:
    output: Path
    novella: Path
    run_id: str | None
    metrics: dict[str, Any]
    stages: list[Any] = field(default_factory=list)  # StageResult per stage
    version: int | None = None                  # registered model version
    model_uri: str | None = None
    evaluation: Evaluation | None = None        # gates, comparison, alias
    walls: dict[str, float | None] = field(default_factory=dict)  # stage name -> wall seconds (None: reused)
    seconds: float | None = None                # the whole pipeline, wall time
    export: Path | None = None                  # an export the pipeline wrote (pipelines/quickstart.py)
    headline: list[tuple[str, str]] | None = None  # (text, metric): the summary's start-vs-Novella lines


def run(ctx: PipelineContext) -> PipelineResult:
    """Run the whole recipe with what `forge run` made once (forge.pipeline: plans, resume, the run folder)."""
    recipe, tracker, plans, folder = ctx.recipe, ctx.tracker, ctx.plans, ctx.folder
    state, out, started = process_state(), Path(recipe.output), time.perf_counter()
    layout = RunLayout(out)
    out.mkdir(parents=True, exist_ok=True)
    resolved = resolved_yaml(recipe)
    if state.is_main_process:
        layout.resolved_recipe.write_text(resolved)
    tags = {"forge.pipeline": "novella", "forge.recipe": recipe.name}
    with parent_run(tracker, out, recipe.name, tags, ctx.resume, main=state.is_main_process) as parent:
        if parent.new:
            tracker.log_text(resolved, RESOLVED)  # the artifact has the file's name
            tracker.log_params({"recipe": recipe.name, "base": base_summary(base_spec(recipe.base)),
                                **(catalog.params(recipe.base) if catalog.is_ref(recipe.base) else {}),
                                "stages": len(recipe.stages), "stage_kinds": ",".join(s.kind for s in recipe.stages)})
        reset_peak_rss()
        with state.main_process_first():  # rank 0 writes generated data, cleaned data and the base
            inputs = prepare_inputs(recipe, out)
        if folder is not None and state.is_main_process:
            folder.check_inputs(input_fingerprints(recipe, inputs))
        tracker.log_summary("data", {**inputs.hygiene, "peak_rss_mb": peak_rss_mb()})  # reading, hygiene, caches
        lineage = new_lineage(recipe.name, base_spec(recipe.base), inputs.base, inputs.catalog)
        used = sorted({n for s in recipe.stages for n in s.sources})
        lineage.data = {n: source_record(inputs.raw[n], inputs.fingerprints[n], inputs.sources[n]) for n in used}
        for n, record in inputs.augmented.items():  # model-written augmentation: the generator and its counts
            if n in lineage.data:
                lineage.data[n].augment = record
            tracker.log_summary("data", {f"{n}.rewrite.{k}": v for k, v in record.items() if k != "file"})
        lineage.hygiene = dict(inputs.hygiene)
        place = RunPlace(out, folder.run_id if folder is not None else None, ctx.resume, recipe.parallelism)
        p = PipelineState(tracker, inputs, place,
                          Planned(plans, ctx.comparison, recipe_model_config(recipe)), parent.runs,
                          state.is_main_process and state.num_processes == 1, log=ctx.log)
        results, walls = _run_stages(recipe, p, lineage)
        lineage.metrics = results[-1].metrics
        novella = layout.novella
        if state.is_main_process:
            write_novella(results[-1].checkpoint, novella, lineage)
        state.wait_for_everyone()
        result = PipelineResult(out, novella, parent.run_id, lineage.metrics, results, walls=walls)
        if state.is_main_process:  # evaluate, gate, model card, register: forge.eval.finish
            done = NovellaRun(novella, lineage, results, inputs.sources, inputs.base, plans, parent.runs.stages,
                              parent.run_id)
            result.evaluation = finish_novella(recipe, done, tracker, ctx.log)
            result.version = lineage.evaluation.version if lineage.evaluation is not None else None
            result.model_uri = f"models:/{recipe.name}/{result.version}" if result.version else None
        _log_novella(tracker, lineage, plans, result.model_uri)
        if state.is_main_process and log_path(out).is_file():
            tracker.log_artifact(log_path(out))  # the run's log so far: every stage's figures
    result.seconds = time.perf_counter() - started
    return result


def _run_stages(recipe: Recipe, p: PipelineState, lineage: Lineage) -> tuple[list[Any], dict[str, float | None]]:
    """Each stage from the previous one's output (the first from the base), its record added to
    `lineage` and, with `eval.after_each_stage`, its output evaluated as soon as it ends. Each
    stage's figures go to the run's log (forge.runlog) and its MLflow run; the terminal gets
    one short line. Returns the results and each stage's wall time (None: reused from a run before)."""
    state, inputs = process_state(), p.inputs
    checkpoint, results, walls = inputs.base, [], {}
    each = recipe.eval is not None and recipe.eval.after_each_stage
    evaluator = StageEvaluator(recipe, inputs.sources, inputs.base, p.place.out, p.tracker, p.log) \
        if each and state.is_main_process else None
    for i, stage in enumerate(recipe.stages):
        p.log(f"stage {i + 1}/{len(recipe.stages)}: {stage.name} ({stage.kind}) from {checkpoint}")
        began = time.perf_counter()
        reused = p.place.resume and finished_result(p.place.layout.stage_final(stage.name)) is not None
        result, record = run_stage(i, stage, checkpoint, p)
        if evaluator is not None:  # into the stage's run now, before the next stage's run starts
            record.evaluation = evaluator.after(stage.name, result.checkpoint, p.runs.stages.get(stage.name))
        if each:
            state.wait_for_everyone()
        lineage.stages.append(record)
        for name, n in result.tokens_by_source.items():
            lineage.data[name].tokens += n
            lineage.data[name].skipped_records = len(inputs.raw[name].skipped)
        walls[stage.name] = None if reused else time.perf_counter() - began
        _say_stage(p, stage, result, walls[stage.name])
        checkpoint = result.checkpoint
        results.append(result)
    return results, walls


def _say_stage(p: PipelineState, stage: Any, result: Any, wall: float | None) -> None:
    """A stage's every figure (key=value) into the run's log, one short line on the terminal."""
    if process_state().is_main_process:
        append(p.place.out, f"  {stage.name}: " + ", ".join(f"{k}={v:.4g}" for k, v in result.metrics.items()))
    done = "reused from an earlier run" if wall is None else f"done in {duration(wall)}"
    p.log(f"  {stage.name}: {done}; {stage_figure(row(stage).headline, result.metrics)}")


def _log_novella(tracker: Tracker, lineage: Lineage, plans: dict[str, Any], model_uri: str | None) -> None:
    """The parent run's record of the Novella: lineage.json, final figures, the headline figures as
    metrics with the comparison as an HTML table (forge.track.story), the stage table, its note."""
    tracker.log_dict(lineage.to_dict(), "lineage.json")
    tracker.log_summary("novella", lineage.metrics)
    log_story(tracker, lineage.evaluation, higher_is_better)
    rows = [stage_row(record, plans.get(record.name)) for record in lineage.stages]
    tracker.log_dict({"columns": list(rows[0]), "data": [list(r.values()) for r in rows]}, "stages.json")
    tracker.describe(pipeline_note(lineage, rows, model_uri))
