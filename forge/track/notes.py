"""Run notes: the Markdown descriptions of a pipeline's parent run, of each stage's run and of the
registered model version, and the parent's table of stages (planned vs measured).

Plain text from plain records (stage settings, plans, the typed lineage); no MLflow import here:
the tracker (forge.track.tracker) sets what these functions write.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from forge.lineage import Lineage, MergeRecord, StageRecord
from forge.track.registry import details_path


def _fmt(v: Any) -> str:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return str(v)
    if isinstance(v, int) or float(v).is_integer() and abs(v) < 1e15:
        return f"{int(v):,}"
    return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.4g}" if abs(v) >= 1e-3 else f"{v:.2e}"


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.3g} s"
    return f"{seconds / 60:.3g} min" if seconds < 5400 else f"{seconds / 3600:.3g} h"


def trained_vocab(checkpoint: str | Path | None) -> int | None:
    """The vocabulary a built checkpoint has (its config.json), None when it cannot be read."""
    if not checkpoint:
        return None
    try:
        vocab = json.loads((Path(checkpoint) / "config.json").read_text()).get("vocab_size")
    except (OSError, ValueError, AttributeError):
        return None
    return vocab if isinstance(vocab, int) else None


def base_summary(spec: Any, checkpoint: str | Path | None = None) -> str:
    """The base as one clean string: its path or catalog reference, or the scratch model in a few
    words (never a dict's repr). With the built `checkpoint`, a scratch base's vocabulary is the one
    its tokenizer got ("vocab 698 (1024 asked)": a BPE trained on little text stops short)."""
    if isinstance(spec, str):
        return spec
    s = spec.get("scratch", spec) if isinstance(spec, dict) else spec
    if not isinstance(s, dict):
        return str(s)
    words = {"hidden_size": "hidden {}", "layers": "{} layers", "heads": "{} heads", "vocab_size": "vocab {}",
             "max_position": "context {}"}
    shape = {k: text.format(s[k]) for k, text in words.items() if k in s}
    vocab = trained_vocab(checkpoint)
    if vocab is not None:
        asked = s.get("vocab_size")
        shape["vocab_size"] = f"vocab {vocab}" + (f" ({asked} asked)" if asked not in (None, vocab) else "")
    return f"scratch {s.get('arch', 'llama')}: {', '.join(shape.values())}"


def plan_line(plan: Any) -> str:
    """One line of a stage's plan: target, chips, layout, predicted time and cost."""
    if plan is None:
        return "not planned"
    if not plan.feasible:
        return f"{plan.target}: does not fit ({plan.reason})"
    layout = f", {plan.layout}" if plan.layout else ""
    return (f"{plan.target}, {plan.chips} chip(s){layout}: {_duration(plan.hours * 3600)} predicted, "
            f"${_fmt(plan.cost_usd)}, {_fmt(plan.chip_hours)} chip-hours")


def stage_note(stage: Any, checkpoint: Path, result: Any, plan: Any, merge: MergeRecord | None = None) -> str:
    """The stage run's description: what ran, on what data, from which checkpoint, results, plan
    (and the merge-back, when the stage's output was interpolated toward its input)."""
    m = result.metrics
    data = ", ".join(f"{name} ({weight:g})" if isinstance(weight, (int, float)) else name
                     for name, weight in stage.sources.items()) or "none"
    tokens = _fmt(m.get("tokens", sum(result.tokens_by_source.values())))
    lines = [f"**{stage.name}** ({stage.kind}): {result.steps:,} steps, {tokens} tokens",
             "", f"- data: {data}", f"- from: `{checkpoint}`", f"- to: `{result.checkpoint}`"]
    results = [f"{label} {_fmt(m[key])}" for key, label in
               (("loss", "train loss"), ("eval_loss_start", "eval loss at start"), ("eval_loss", "eval loss"),
                ("eval_rewards/accuracy", "preference accuracy"), ("reward_mean_start", "reward at start"),
                ("reward_mean", "reward"), ("tokens_per_s_mean", "tokens/s")) if key in m and m[key] is not None]
    if "train_seconds" in m:
        results.append(f"training time {_duration(m['train_seconds'])}")
    if results:
        lines.append("- results: " + ", ".join(results))
    if merge:
        lines.append(f"- merged back: {merge.weight:g} of the trained weights (`{merge.trained_checkpoint}`), "
                     "the rest from the input")
    lines.append(f"- plan: {plan_line(plan)}")
    return "\n".join(lines)


def stage_row(record: StageRecord, plan: Any) -> dict[str, Any]:
    """One row of the parent's stage table, from a stage's lineage record and its plan."""
    m = record.metrics
    return {"stage": record.name, "kind": record.kind, "steps": record.steps,
            "tokens": int(m.get("tokens", sum(record.tokens_by_source.values()))),
            "planned_s": round(plan.hours * 3600, 3) if plan is not None and plan.feasible else None,
            "measured_s": round(m["train_seconds"], 3) if "train_seconds" in m else None,
            "train_loss": m.get("loss"), "eval_loss": m.get("eval_loss")}


def pipeline_note(lineage: Lineage, rows: list[dict[str, Any]], model_uri: str | None = None) -> str:
    """The parent run's description: base, data, the stages in a small table, the result."""
    data = ", ".join(f"{n} ({_fmt(d.tokens)} tokens)" for n, d in lineage.data.items())
    base = base_summary(lineage.base.spec, lineage.base.checkpoint)
    lines = [f"**{lineage.name}**: {len(rows)} stage(s) from `{base}`", "",
             f"- data: {data or 'none'}"]
    final = lineage.metrics
    start = lineage.stages[0].metrics.get("eval_loss_start") if lineage.stages else None
    if "eval_loss" in final:
        lines.append(f"- final eval loss {_fmt(final['eval_loss'])}" + (f" (start {_fmt(start)})" if start else ""))
    ev = lineage.evaluation
    if ev is not None and ev.gates:
        lines.append(f"- gates: {'pass' if ev.passed else 'FAIL'} ("
                     + "; ".join(g.text for g in ev.gates) + ")")
    if model_uri:
        lines.append(f"- registered: `{model_uri}`" + (f"; {ev.alias}" if ev is not None and ev.alias else ""))
    lines += ["", "| stage | kind | steps | tokens | planned | measured | train loss | eval loss |",
              "|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        cells = [r["stage"], r["kind"], _fmt(r["steps"]), _fmt(r["tokens"]),
                 _duration(r["planned_s"]) if r["planned_s"] is not None else "-",
                 _duration(r["measured_s"]) if r["measured_s"] is not None else "-",
                 _fmt(r["train_loss"]) if r["train_loss"] is not None else "-",
                 _fmt(r["eval_loss"]) if r["eval_loss"] is not None else "-"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def model_description(lineage: Lineage, run_id: str | None, card: str | None = None, limit: int = 5000) -> str:
    """The registered version's description: the lineage in brief, then the model card when there is
    one (without its title), cut at a line to fit MLflow's `limit` characters."""
    stages = " -> ".join(f"{s.name} ({s.kind})" for s in lineage.stages)
    base = base_summary(lineage.base.spec, lineage.base.checkpoint)
    lines = [f"Novella **{lineage.name}**: {base} customized by {stages}.", ""]
    if lineage.data:
        lines.append("Data: " + ", ".join(f"{n} (sha256 {d.sha256[:12]}, {_fmt(d.tokens)} tokens"
                                           + (", proprietary" if d.proprietary else "") + ")"
                                           for n, d in lineage.data.items()) + ".")
    final = lineage.metrics
    shown = {k: final[k] for k in ("eval_loss", "loss") if k in final}
    if shown:
        lines.append("Final: " + ", ".join(f"{k} {_fmt(v)}" for k, v in shown.items()) + ".")
    if run_id:
        version = lineage.evaluation.version if lineage.evaluation is not None else None
        more = f"; data hashes, gates, compute and plan: {details_path(version)}" if version is not None else ""
        lines.append(f"Source run: {run_id} (lineage.json among its artifacts{more}).")
    text = "\n".join(lines)
    if card:
        body = card.split("\n", 1)[1].lstrip("\n") if card.startswith("# ") else card
        text += "\n\n" + body.rstrip()
    if len(text) > limit:
        more = "\n\n... (the whole card: MODEL_CARD.md among the source run's artifacts)"
        text = text[: limit - len(more)].rsplit("\n", 1)[0] + more
    return text
