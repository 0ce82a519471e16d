"""The end of a Novella run: evaluate (the recipe's `eval:` block on the starting checkpoint, the
stages' outputs if asked, and the Novella), check the gates, record it all in lineage and MLflow,
write MODEL_CARD.md, and register with `candidate` (and the deployment alias if it earned it)."""
from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from forge.eval.card import write_model_card
from forge.eval.gates import GateResult, check_gates, passed
from forge.eval.registry import Decision, Standing, register
from forge.eval.report import format_table, plot, to_markdown
from forge.eval.stage_eval import open_cache
from forge.eval.suite import NOVELLA, START, Comparison, primary_metric, resolve_suite, run_suite
from forge.lineage import ComputeRecord, EvaluationRecord, Lineage
from forge.recipe import Base
from forge.runlog import append
from forge.track.notes import base_summary, model_description, plan_line
from forge.track.protocol import Tracker


@dataclass
class Evaluation:
    comparison: Comparison
    gates: list[GateResult] = field(default_factory=list)
    primary: str = ""
    decision: Decision | None = None
    reference: str = ""         # what the start is: the checkpoint the customization began from
    scratch_only: bool = False  # the start is a random initialisation (one stage from scratch)

    @property
    def passed(self) -> bool:
        return passed(self.gates)

    def record(self, suite: Any) -> EvaluationRecord:
        """What lineage keeps (and the model card shows)."""
        return EvaluationRecord.model_validate(
            {**self.comparison.as_dict(), "domain": suite.domain, "general": suite.general, "primary": self.primary,
             "gates": [g.as_dict() for g in self.gates], "passed": self.passed,
             "markdown": to_markdown(self.comparison)})


@dataclass
class NovellaRun:
    """What the pipeline hands the end of a run: the Novella folder and its lineage, the stages'
    results, the inputs they read, the plans, and the MLflow runs (the parent's and each stage's)."""

    novella: Path
    lineage: Lineage
    results: list[Any]            # forge.train.result.StageResult per stage, in order
    sources: dict[str, Any]       # data source name -> forge.data.sources.Source (as trained on)
    base: Path                    # the starting checkpoint
    plans: dict[str, Any] = field(default_factory=dict)     # stage name -> StagePlan on the recipe's target
    stage_runs: dict[str, str] = field(default_factory=dict)  # stage name -> MLflow run id
    run_id: str | None = None     # the parent run


def compute_record(stages: list[Any], results: list[Any], plans: dict[str, Any]) -> dict[str, ComputeRecord]:
    """Per training stage: planned (on the recipe's target) vs measured (here) steps, tokens, hours."""
    out = {}
    for stage, result in zip(stages, results):
        if not result.steps:
            continue
        plan = plans.get(stage.name)
        planned = {} if plan is None else {
            "target": plan.target, "planned_steps": plan.steps, "planned_tokens": int(plan.tokens_trained),
            "planned_hours": plan.hours, "planned_flops": plan.flops_total}
        out[stage.name] = ComputeRecord(steps=result.steps, tokens=int(result.metrics.get("tokens", 0)),
                                        train_hours=result.metrics.get("train_seconds", 0.0) / 3600, **planned)
    return out


def reference(recipe: Any, base: Path, results: list) -> tuple[Path, str]:
    """The checkpoint the recipe's customization began from, and what it is: the base (a folder or a
    catalog phase), or, where the base is trained from scratch and more stages follow, the first
    stage's output (retention against a random initialisation means nothing)."""
    if isinstance(recipe.base, Base) and len(results) > 1:
        first = recipe.stages[0].name
        return Path(results[0].checkpoint), f"{first}'s output, as the base is trained from scratch"
    if isinstance(recipe.base, Base):
        return Path(base), "a random initialisation (the base is trained from scratch)"
    return Path(base), f"the base, {recipe.base}"


def evaluate_run(recipe, base: Path, results: list, novella: Path, sources: dict, log=print,
                 cache=None) -> tuple[Evaluation, object, dict]:
    """The recipe's suite on start (the checkpoint the customization began from: `reference`),
    (each stage,) Novella; the gates on the Novella. With the run folder's `cache`, what was
    measured when a stage ended is not measured again."""
    suite = resolve_suite(recipe.eval, recipe.stages, recipe.data)
    start, what = reference(recipe, base, results)
    models = {START: start}
    if suite.after_each_stage:
        models.update({s.name: r.checkpoint for s, r in zip(recipe.stages[:-1], results[:-1])})
    models[NOVELLA] = Path(novella)
    comparison = run_suite(models, suite, sources, log=log, cache=cache)
    ev = Evaluation(comparison, check_gates(suite, comparison.metrics[NOVELLA]), primary_metric(suite),
                    reference=what, scratch_only=isinstance(recipe.base, Base) and len(results) < 2)
    return ev, suite, models


def log_comparison(tracker: Tracker, ev: Evaluation, stage_runs: dict[str, str], skip: set[str] = frozenset()) -> None:
    """Parent run: the Novella's figures, the table (text, Markdown, JSON) and the chart; each stage
    run that was evaluated (and is not in `skip`, runs that got them when their stage ended): its
    own figures. Single figures, so a summary (params `suite.*` and summary.json rows), not
    one-point metric charts."""
    c = ev.comparison
    tracker.log_summary("suite", c.metrics[c.models[-1]])
    tracker.log_text(format_table(c), "eval/comparison.txt")
    tracker.log_text(to_markdown(c), "eval/comparison.md")
    tracker.log_dict(c.as_dict(), "eval/comparison.json")
    with tempfile.TemporaryDirectory() as tmp:
        tracker.log_artifact(plot(c, Path(tmp) / "comparison.png"), "eval")
    for label in c.models:
        if label in stage_runs and stage_runs[label] not in skip:
            tracker.log_summary("suite", c.metrics[label], run_id=stage_runs[label])


def finish_novella(recipe: Any, run: NovellaRun, tracker: Tracker, log: Callable[[str], None] = print) -> Evaluation:
    """Evaluate, gate, record, write the model card and register (rank 0 only)."""
    out, lineage, stage_runs = Path(recipe.output), run.lineage, run.stage_runs
    cache = open_cache(resolve_suite(recipe.eval, recipe.stages, recipe.data), run.sources, out)
    ev, suite, models = evaluate_run(recipe, run.base, run.results, run.novella, run.sources, log, cache)
    # the full table and each gate go to the run's log; the terminal's summary (forge.eval.summary) is short
    append(out, "\n".join([format_table(ev.comparison).rstrip(), *(f"gate {g.text}" for g in ev.gates)]))
    lineage.evaluation = evaluation = ev.record(suite)
    lineage.compute = compute_record(recipe.stages, run.results, run.plans)
    last = recipe.stages[-1].name  # the Novella is the last stage's output: its run gets those figures
    runs = {**stage_runs, NOVELLA: stage_runs[last]} if last in stage_runs else dict(stage_runs)
    done = {r for label, r in runs.items() if label in models and cache.logged(models[label], r)}
    log_comparison(tracker, ev, runs, done)
    for label, r in runs.items():
        if label in models and r not in done:
            cache.mark_logged(models[label], r)
    if recipe.tracking.register_model:
        value = ev.comparison.metrics[NOVELLA].get(ev.primary)
        if value is None:
            value = lineage.metrics.get(ev.primary)
        log(f"registering the Novella as {recipe.name} in MLflow's model registry (alias {recipe.tracking.alias})")
        version, ev.decision = register(tracker, run.novella, recipe.name, recipe.tracking.alias,
                                        registry_tags(recipe, run, ev), Standing(ev.primary, value, ev.passed))
        taken = "took" if ev.decision.promote else "did not take"
        evaluation.alias = (f"version {version} is `candidate`; it {taken} `{recipe.tracking.alias}` "
                            f"({ev.decision.reason})")
        evaluation.version = version
    lineage.write(Path(run.novella) / "lineage.json")
    card = write_model_card(run.novella, lineage, suite.intended_use, suite.limitations)
    tracker.log_artifact(card)
    if evaluation.version is not None:  # the version's page: the lineage in brief, then the card
        tracker.describe_model(recipe.name, evaluation.version, model_description(lineage, run.run_id, card.read_text()),
                               model_description(lineage, run.run_id))
    return ev


def registry_tags(recipe: Any, run: NovellaRun, ev: Evaluation) -> dict[str, str]:
    """The registered version's tags: base, stages, run, gates, data hashes, compute and plan."""
    lineage = run.lineage
    return {"forge.base": base_summary(lineage.base.spec, lineage.base.checkpoint),
            "forge.stages": ",".join(s.name for s in recipe.stages), "forge.run_id": run.run_id or "",
            "forge.gates": "pass" if ev.passed else "fail",
            **{f"forge.data.{n}": d.sha256[:16] for n, d in lineage.data.items()},
            **{f"forge.gate.{g.metric}": g.text for g in ev.gates},
            **{f"forge.compute.{s}.{k}": f"{v:.6g}" if isinstance(v, float) else str(v)
               for s, c in (lineage.compute or {}).items() for k, v in c.model_dump().items()},
            "forge.plan": "; ".join(f"{s.name}: {plan_line(run.plans.get(s.name))}" for s in recipe.stages)}
