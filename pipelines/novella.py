"""The Novella pipeline: base -> stage -> stage -> ... -> Novella folder, registered in MLflow.

Runs the recipe's stages in order, each stage's output checkpoint feeding the next, inside one
parent MLflow run with a nested child run per stage, and writes the final model with its lineage.

    forge run recipes/quickstart.yaml
"""
from __future__ import annotations

from pathlib import Path

from forge.data.prepare import clean_sources
from forge.data.sources import Source, resolve_source
from forge.lineage import new_lineage, source_record, write_novella
from forge.plan.recipe_plan import plan_recipe, recipe_model_config
from forge.plan.runlog import COMPARE_TARGETS, log_measured, log_stage_plan
from forge.recipe import Recipe, resolved_yaml
from forge.scratch import build_scratch_base, scratch_key
from forge.stages import runner
from forge.stages.result import StageResult
from forge.train.checkpoint import finished_result
from forge.track import Tracker
from forge.train.accel import process_state


def prepare_base(recipe: Recipe, sources: dict[str, Source], fingerprints: dict[str, str], out: Path) -> Path:
    if isinstance(recipe.base, str):
        return Path(recipe.base)
    scratch = recipe.base.scratch
    key = scratch_key(scratch, [fingerprints[n] for n in scratch.tokenizer_sources])
    return build_scratch_base(scratch, [sources[n] for n in scratch.tokenizer_sources], out / f"base-{key}")


def run(recipe: Recipe, tracker: Tracker, log=print, plans=None, resume: bool = False) -> dict:
    """Run the whole recipe; return a summary (novella path, registered version, metrics).

    `plans`: the recipe's per-stage plans on its target (from `forge run`; made here if absent).
    `resume`: reuse stages that finished and continue an interrupted one from its last checkpoint."""
    plans = plans if plans is not None else plan_recipe(recipe)
    comparison = plan_recipe(recipe, target=COMPARE_TARGETS)
    model_config = recipe_model_config(recipe)
    state = process_state()
    out = Path(recipe.output)
    out.mkdir(parents=True, exist_ok=True)
    resolved = resolved_yaml(recipe)
    if state.is_main_process:
        (out / "recipe.resolved.yaml").write_text(resolved)
    summary: dict = {"output": str(out)}
    with tracker.run(recipe.name, tags={"forge.pipeline": "novella", "forge.recipe": recipe.name}) as run_id:
        summary["run_id"] = run_id
        tracker.log_text(resolved, "recipe.resolved.yaml")
        tracker.log_params({"recipe": recipe.name, "base": str(recipe.base), "stages": len(recipe.stages),
                            "stage_kinds": ",".join(s.kind for s in recipe.stages)})
        with state.main_process_first():  # rank 0 writes generated data, cleaned data and the base
            raw = {name: resolve_source(name, cfg, out / "data") for name, cfg in recipe.data.items()}
            fingerprints = {name: src.fingerprint() for name, src in raw.items()}
            sources, hygiene = clean_sources(recipe.hygiene, raw, recipe.data, fingerprints, out / "data")
            checkpoint = prepare_base(recipe, sources, fingerprints, out)
        tracker.log_metrics(hygiene)
        lineage = new_lineage(recipe, checkpoint)
        used = {n for s in recipe.stages for n in s.weights}
        lineage["data"] = {n: source_record(raw[n], fingerprints[n], sources[n]) for n in sorted(used)}
        lineage["hygiene"] = hygiene

        for i, stage in enumerate(recipe.stages):
            log(f"stage {i + 1}/{len(recipe.stages)}: {stage.name} ({stage.kind}) from {checkpoint}")
            with tracker.run(stage.name, tags={"forge.stage": stage.kind, "forge.stage_index": str(i)}):
                tracker.log_params(stage.model_dump(mode="json"))
                tracker.log_params({"input_checkpoint": str(checkpoint)})
                log_stage_plan(tracker, plans[i], [p for p in comparison if p.stage == stage.name])
                for name, weight in stage.weights.items():
                    tracker.log_dataset(name, raw[name].location, fingerprints[name], tags={"weight": str(weight)})
                stage_dir = out / "stages" / stage.name
                done = finished_result(stage_dir / "final") if resume else None
                if done is not None:
                    log("  finished in an earlier run: reusing its checkpoint")
                    tracker.set_tags({"reused": str(stage_dir / "final")})
                    result = StageResult.from_dict(done)
                else:
                    result = runner(stage.kind)(stage, checkpoint, sources, stage_dir, tracker, resume=resume)
                tracker.log_metrics({f"final.{k}": v for k, v in result.metrics.items()})
                if state.is_main_process and state.num_processes == 1:  # the planner's local model is one process
                    log_measured(tracker, model_config, stage, result.steps, result.metrics, stage_dir)
            lineage["stages"].append({
                "name": stage.name, "kind": stage.kind, "settings": stage.model_dump(mode="json"),
                "input_checkpoint": str(checkpoint), "output_checkpoint": str(result.checkpoint),
                "steps": result.steps, "tokens_by_source": result.tokens_by_source,
                "repeats": result.repeats, "metrics": result.metrics, **result.extra,
            })
            for name, n in result.tokens_by_source.items():
                lineage["data"][name]["tokens"] += n
                # bad records are skipped where the raw data is read (cleaned caches are well-formed)
                lineage["data"][name]["skipped_records"] = len(raw[name].skipped)
            log("  " + ", ".join(f"{k}={v:.4g}" for k, v in result.metrics.items()))
            checkpoint = result.checkpoint

        lineage["metrics"] = lineage["stages"][-1]["metrics"]
        novella = out / "novella"
        if state.is_main_process:
            write_novella(checkpoint, novella, lineage)
        state.wait_for_everyone()
        summary["novella"] = str(novella)
        tracker.log_dict(lineage, "lineage.json")
        tracker.log_metrics({f"novella.{k}": v for k, v in lineage["metrics"].items()})
        if recipe.tracking.register_model:
            tags = {"forge.base": str(lineage["base"]["spec"]), "forge.stages": ",".join(s.name for s in recipe.stages),
                    "forge.run_id": run_id or "", **{f"forge.data.{n}": d["sha256"][:16] for n, d in lineage["data"].items()}}
            summary["version"] = tracker.register_model(novella, recipe.name, recipe.tracking.alias, tags)
            summary["model_uri"] = f"models:/{recipe.name}@{recipe.tracking.alias}"
    summary["metrics"] = lineage["metrics"]
    return summary
