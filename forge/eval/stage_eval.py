"""`eval.after_each_stage`: the recipe's suite on each stage's output as soon as the stage ends,
beside the starting checkpoint (the baseline for retention and domain gain). The figures go to
the stage's MLflow run (params `suite.<metric>` and summary.json rows, written when the stage ended) and its lineage record,
and into the run folder's EvalCache, so the comparison at the end of the run and a `--resume`
reuse them instead of evaluating again.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from forge.eval.cache import EvalCache, suite_key
from forge.eval.suite import START, resolve_suite, run_suite
from forge.rundir import RunLayout
from forge.runlog import append
from forge.track.protocol import Tracker


def open_cache(suite, sources: dict, out: Path) -> EvalCache:
    """The run folder's cache for this suite on these (cleaned) sources."""
    return EvalCache(RunLayout(Path(out)).eval_cache, suite_key(suite, {n: sources[n].fingerprint() for n in suite.sources()}))


def log_once(tracker: Tracker, cache: EvalCache, run_id: str | None, folder: Path, metrics: dict[str, float]) -> None:
    """`suite.*` figures into a stage's run, unless that run already holds this model's figures."""
    if run_id and not cache.logged(folder, run_id):
        tracker.log_summary("suite", metrics, run_id=run_id)
        cache.mark_logged(folder, run_id)


class StageEvaluator:
    """Evaluates stage outputs for one pipeline run (rank 0 only)."""

    def __init__(self, recipe: Any, sources: dict[str, Any], base: Path, out: Path, tracker: Tracker,
                 log: Callable[[str], None] = print):
        self.suite = resolve_suite(recipe.eval, recipe.stages, recipe.data)
        self.sources, self.base, self.tracker, self.log, self.out = sources, Path(base), tracker, log, Path(out)
        self.cache = open_cache(self.suite, sources, out)

    def after(self, stage: str, checkpoint: Path, run_id: str | None) -> dict[str, float]:
        """The suite on `checkpoint` (the starting checkpoint's figures come from the cache after
        the first stage); its figures, with retention and domain gain, logged to `run_id`."""
        comparison = run_suite({START: self.base, stage: Path(checkpoint)}, self.suite, self.sources,
                               log=self.log, cache=self.cache)
        metrics = comparison.metrics[stage]
        log_once(self.tracker, self.cache, run_id, Path(checkpoint), metrics)
        append(self.out, f"  {stage}: eval: " + ", ".join(f"{k}={v:.4g}" for k, v in metrics.items()))  # the run's log
        return metrics
