"""The end of a run as a person reads it in ten seconds: one row per stage (kind, steps, tokens, wall
time, the kind's headline figure from forge.kinds), start versus Novella on the suite's headline
metrics (retention against the checkpoint the customization began from), the gates with pass or
fail, and where the Novella, the export, the run log and the MLflow UI are. The long figures stay
in the run log (forge.runlog) and MLflow."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from forge.eval.suite import NOVELLA, START
from forge.kinds import KINDS, Headline
from forge.runlog import log_path
from forge.track.names import summary_value

MAX_LINES = 8  # start-versus-Novella lines; the rest are in the log and eval/comparison.md


@dataclass
class Ending:
    """What the summary shows, gathered from a finished run (`ending`) or built by a test."""

    name: str                                # the recipe's
    stages: list[Any]                        # each stage's settings (name, kind)
    results: list[Any]                       # forge.train.result.StageResult per stage
    walls: dict[str, float | None] = field(default_factory=dict)  # stage name -> wall seconds (None: reused)
    evaluation: Any = None                   # forge.eval.finish.Evaluation
    seconds: float | None = None             # the whole run
    headline: list[tuple[str, str]] | None = None  # (text, metric) to show instead of the default choice
    where: list[tuple[str, str]] = field(default_factory=list)  # (what, where) lines at the end


# ------------------------------------------------------------------------------------- figures
def duration(seconds: float | None) -> str:
    if seconds is None:
        return "reused"
    if seconds < 60:
        return f"{seconds:.1f} s" if seconds < 10 else f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{int(seconds // 60)} min {int(seconds % 60)} s"
    return f"{int(seconds // 3600)} h {int(seconds % 3600 // 60)} min"


def count(n: float | None) -> str:
    if n is None:
        return "-"
    for limit, unit in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if n >= limit:
            return f"{n / limit:.3g}{unit}"
    return f"{int(n)}"


def figure(metric: str, value: float | None, percent: bool = False) -> str:
    """A figure for a person: a rate as a percentage, a change as a signed one, a perplexity as it is."""
    if value is None:
        return "-"
    if metric.startswith(("retention.", "domain_gain.")):
        return f"{100 * value:+.1f}%"
    if percent or metric.startswith(("fact_recall", "instruct.")) or metric == "preference_accuracy":
        return f"{100 * value:.1f}%"
    if metric.startswith("ppl."):
        return f"{value:.2f}"
    if "loss" in metric:
        return f"{value:.3f}"
    return summary_value(value)


# ---------------------------------------------------------------------------------- the stages
def preferred(headline: Headline, metrics: dict[str, float]) -> Headline:
    """The headline's `prefer` where the stage measured it (an env's held-out reward), else itself."""
    return headline.prefer if headline.prefer is not None and headline.prefer.metric in metrics else headline


def stage_figure(headline: Headline, metrics: dict[str, float]) -> str:
    """The stage's headline figure, from its value when the stage began where the loop measured it."""
    headline = preferred(headline, metrics)
    end = metrics.get(headline.metric)
    if end is None:
        return f"{headline.label}: not measured"
    start = metrics.get(f"{headline.metric}_start")
    shown = figure(headline.metric, end, headline.percent)
    return f"{headline.label}: {figure(headline.metric, start, headline.percent)} -> {shown}" if start is not None \
        else f"{headline.label}: {shown}"


def stage_table(e: Ending) -> list[str]:
    """A header and one row per stage: stage, kind, steps, tokens, wall time, headline figure."""
    rows = [["stage", "kind", "steps", "tokens", "time", "headline"]]
    for stage, result in zip(e.stages, e.results):
        m = result.metrics
        tokens = m.get("tokens", sum(getattr(result, "tokens_by_source", {}).values()) or None)
        rows.append([stage.name, stage.kind, count(result.steps) if result.steps else "-", count(tokens),
                     duration(e.walls.get(stage.name, m.get("train_seconds"))),
                     stage_figure(KINDS[stage.kind].headline, m)])
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    right = {2, 3, 4}  # numbers line up on the right
    return ["  " + "  ".join(c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))).rstrip()
            for r in rows]


# ------------------------------------------------------------------------- start versus Novella
def label(metric: str) -> str:
    """What a suite metric is called on the summary."""
    head, _, rest = metric.partition(".")
    names = {"ppl": "perplexity, {}", "loss": "loss, {}", "retention": "perplexity change vs start, {}",
             "domain_gain": "perplexity fall vs start, {}"}
    if head in names and rest:
        return names[head].format(rest)
    if head == "fact_recall":
        split = rest.rpartition(".")[0]
        return f"fact recall, {split}" if split else "fact recall"
    return {"instruct.accuracy": "instruction following", "preference_accuracy": "preference accuracy",
            "reward.mean": "mean reward"}.get(metric, metric)


def _headline_worthy(metric: str, names: set[str]) -> bool:
    head, _, rest = metric.partition(".")
    if head == "loss":
        return f"ppl.{rest}" not in names
    if metric.endswith(".contains"):
        return metric.removesuffix(".contains") + ".exact" not in names
    if head == "reward":
        return metric == "reward.mean"
    return head in ("ppl", "retention", "domain_gain", "fact_recall", "instruct", "preference_accuracy")


def headline_metrics(evaluation: Any) -> list[str]:
    """The suite's headline metrics: perplexities, their change against the start, fact recall,
    instruction following, preference accuracy, mean reward; every gated metric and the primary one."""
    metrics = evaluation.comparison.metrics
    names = list(dict.fromkeys([*metrics.get(START, {}), *metrics.get(NOVELLA, {})]))
    gated = {g.metric for g in evaluation.gates}
    return [n for n in names if n in gated or n == evaluation.primary or _headline_worthy(n, set(names))]


def versus(e: Ending) -> list[str]:
    """Start versus Novella: a title naming what the start is, then one line per headline metric
    (`text  start -> novella  (metric: start -> novella as MLflow holds them)`)."""
    ev = e.evaluation
    reference = getattr(ev, "reference", "") if ev is not None else ""
    title = f"{e.name}: start -> Novella" + (f" (start: {reference})" if reference else "")
    if ev is None:
        return [f"{title}: not evaluated (rank 0 evaluates)"]
    scratch = getattr(ev, "scratch_only", False)
    picked = e.headline if e.headline is not None else [(label(n), n) for n in headline_metrics(ev)]
    if scratch:  # against a random initialisation a change means nothing
        picked = [(t, n) for t, n in picked if not n.startswith(("retention.", "domain_gain."))]
    start, end = ev.comparison.metrics.get(START, {}), ev.comparison.metrics.get(NOVELLA, {})
    picked = [(t, n) for t, n in picked if n in start or n in end]
    if not picked and len(e.stages) == 1:  # the one stage's own held-out figure is start versus Novella
        m = e.results[0].metrics
        h = preferred(KINDS[e.stages[0].kind].headline, m)
        start, end = {h.metric: m.get(f"{h.metric}_start")}, {h.metric: m.get(h.metric)}
        picked = [(f"{h.label}, held out (the stage's own)", h.metric)] if end[h.metric] is not None else []
    if not picked:
        return [f"{title}: the suite measured nothing (no eval: block, and no stage trains on plain text); "
                "each stage's held-out figure is in its row above"]
    width = max(len(t) for t, _ in picked[:MAX_LINES])
    out = [title]
    for text, n in picked[:MAX_LINES]:
        a, b = start.get(n), end.get(n)
        percent = any(h.percent and h.metric == n for h in (k.headline for k in KINDS.values()))
        shown = f"{figure(n, a, percent)} -> {figure(n, b, percent)}"
        exact = " -> ".join(summary_value(v) if v is not None else "-" for v in (a, b))
        out.append(f"  {text.ljust(width)}  {shown.ljust(17)}  ({n}: {exact})")
    if len(picked) > MAX_LINES:
        out.append(f"  ... {len(picked) - MAX_LINES} more in the run log and the run's eval/comparison.md")
    if scratch:
        out.append("  retention: none (the recipe's only stage trains from scratch: no earlier checkpoint to keep)")
    return out


def gates(ev: Any) -> list[str]:
    """`gates: PASS|FAIL (...)`, then each gate as `gate <gate>: <metric> = <value>, ...: pass|FAIL by ...`."""
    if ev is None or not ev.gates:
        return ["gates: none set (eval.gates)"]
    failed = sum(not g.passed for g in ev.gates)
    verdict = f"FAIL ({failed} of {len(ev.gates)} failed)" if failed else f"PASS (all {len(ev.gates)})"
    return [f"gates: {verdict}", *(f"gate {g.text}" for g in ev.gates)]


def render(e: Ending) -> list[str]:
    """The whole summary, line by line."""
    total = f" in {duration(e.seconds)}" if e.seconds is not None else ""
    head = f"summary: {e.name}, {len(e.stages)} stage(s){total}"
    where = [f"{what + ':':<8} {place}" for what, place in e.where]
    return [head, *stage_table(e), *versus(e), *gates(e.evaluation), *where]


def ending(recipe: Any, result: Any, ui: str) -> Ending:
    """The summary of a pipeline's result (pipelines/novella.py PipelineResult) for `recipe`."""
    ev = result.evaluation
    where = [("novella", str(result.novella))]
    if getattr(result, "export", None):
        where.append(("export", f"{result.export} (Bedrock Custom Model Import layout)"))
    where.append(("mlflow", f"{recipe.tracking_uri} (experiment {recipe.experiment!r}, run {result.run_id})"))
    if result.model_uri:
        where.append(("model", f"{result.model_uri} (version {result.version})"))
    if ev is not None and ev.decision is not None:
        where.append(("alias", f"{'promoted' if ev.decision.promote else 'not promoted'}: {ev.decision.reason}"))
    if log_path(recipe.output).is_file():
        where.append(("log", f"{log_path(recipe.output)} (every stage's figures, the full comparison)"))
    where.append(("ui", ui))
    return Ending(recipe.name, list(recipe.stages), list(result.stages), dict(getattr(result, "walls", {})), ev,
                  getattr(result, "seconds", None), getattr(result, "headline", None), where)


def write(lines: list[str], out: str | Path | None = None) -> None:
    """Print the summary (and keep it at the end of the run's log)."""
    from forge.runlog import append

    text = "\n".join(lines)
    print(text, flush=True)
    if out is not None:
        append(out, text)
