"""The quickstart pipeline: the Novella pipeline (stages, evaluation against the starting
checkpoint, gates, registration: pipelines/novella.py), then the Novella exported for Amazon
Bedrock Custom Model Import, and the start-versus-Novella headline (fact recall on held-out and on
training phrasings and on the products known only from documents, and how many of those products'
page sentences it completes: stored versus answered; general perplexity, instruction following)
logged on the run and shown as the
start-versus-Novella lines of the run's summary (forge.eval.summary, printed by `forge run`).

    forge run recipes/quickstart.yaml
"""
from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from forge.eval.suite import NOVELLA, START, resolve_suite
from forge.pipeline import PipelineContext
from forge.recipe import Recipe
from forge.rundir import RunLayout
from forge.train.accel import process_state
from pipelines import novella

# (what the line says, the suite's metric; {general} is the first general source)
HEADLINE = (("fact recall, held-out phrasings", "fact_recall.heldout.exact"),
            ("fact recall, training phrasings", "fact_recall.train.exact"),
            ("fact recall, document-only products", "fact_recall.doconly.exact"),
            # the same facts as the documents' own sentences up to the value: stored, whether or not a question gets them
            ("document-only facts stored (page sentences completed)", "fact_recall.stated.exact"),
            ("general perplexity ({general})", "ppl.{general}"),
            ("general perplexity rise vs start", "retention.{general}"),
            ("instruction following (held-out)", "instruct.accuracy"))
SECTION = "quickstart"  # the parent run's summary section: quickstart.<start|novella>.<metric>


def run(ctx: PipelineContext) -> novella.PipelineResult:
    """The Novella pipeline, then (rank 0) the Bedrock export and the headline."""
    recipe, tracker, log = ctx.recipe, ctx.tracker, ctx.log
    started = time.perf_counter()
    result = novella.run(ctx)
    if not process_state().is_main_process or result.evaluation is None:
        return result
    export = export_bedrock(result.novella, RunLayout(Path(recipe.output)).export("bedrock"), recipe.tracking_uri, log)
    lines = headline(recipe, result.evaluation.comparison.metrics)
    seconds = time.perf_counter() - started
    result.export, result.seconds, result.headline = export, seconds, [(x.text, x.metric) for x in lines]
    if result.run_id:
        values = {f"{label}.{x.metric}": v for x in lines for label, v in ((START, x.start), (NOVELLA, x.novella))
                  if v is not None}
        tracker.log_summary(SECTION, {**values, "seconds": round(seconds, 1), "export": str(export)},
                            run_id=result.run_id)
    return result


def export_bedrock(novella_dir: Path, out: Path, tracking_uri: str, log: Callable[[str], None]) -> Path:
    """The Novella in Bedrock Custom Model Import's layout at `out` (an earlier export there is
    replaced), recorded on the Novella's MLflow run by forge.export."""
    from forge.export.layout import ExportOptions, export
    from forge.export.source import resolve

    with tempfile.TemporaryDirectory(prefix="forge-export-") as work:
        src = resolve(str(novella_dir), tracking_uri, Path(work))
        export(src, out, ExportOptions(format="bedrock", overwrite=True), log=log)
    return out


@dataclass
class Line:
    text: str
    metric: str
    start: float | None
    novella: float | None


def headline(recipe: Recipe, metrics: dict[str, dict[str, float]]) -> list[Line]:
    """Start versus Novella on each headline metric the suite measured."""
    suite = resolve_suite(recipe.eval, recipe.stages, recipe.data)
    general = (suite.general or ["general"])[0]
    out = []
    for text, metric in HEADLINE:
        name = metric.format(general=general)
        start, end = metrics.get(START, {}).get(name), metrics.get(NOVELLA, {}).get(name)
        if start is not None or end is not None:
            out.append(Line(text.format(general=general), name, start, end))
    return out
