"""MODEL_CARD.md for a Novella: intended use, base, stages and their data (names, sizes, hashes,
hygiene counts; never the data itself), the evaluation table and gates, compute planned vs used,
and limitations. Built from the lineage record alone, so nothing read from the data can leak in; the
text passes forge.scrub (paths, settings and the intended use may hold secrets or personal data)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from forge.lineage import EvaluationRecord, Lineage
from forge.scrub import scrub
from forge.track.notes import base_summary


def _num(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return f"{v:,}" if isinstance(v, int) else str(v)


def _table(header: list[str], rows: list[list[Any]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(_num(c) for c in r) + " |" for r in rows]
    return out + [""]


def model_card(lineage: Lineage, intended_use: str | None = None, limitations: list[str] | None = None) -> str:
    name, ev = lineage.name, lineage.evaluation or EvaluationRecord()
    domain = ", ".join(ev.domain) or "the recipe's data"
    lines = [f"# {name}", "", f"A Novella made by forge {lineage.forge_version} on {lineage.created}.", "",
             "## Intended use", "",
             intended_use or (f"Research and evaluation of a language model customized on {domain}. Not evaluated "
                              "for safety, factual reliability or any high-stakes use; review its outputs."), "",
             "## Base", "", f"- {base_summary(lineage.base.spec, lineage.base.checkpoint)}", ""]
    lines += ["## Stages", ""]
    lines += _table(["stage", "kind", "steps", "tokens by source"],
                    [[s.name, s.kind, s.steps, ", ".join(f"{k}: {v:,}" for k, v in s.tokens_by_source.items()) or "-"]
                     for s in lineage.stages])
    lines += ["## Data", "", "Names, sizes and content hashes only; the data itself is not part of this card.", ""]
    lines += _table(["source", "proprietary", "bytes", "sha256 (first 16)", "tokens trained", "skipped records", "cleaned"],
                    [[n, "yes" if d.proprietary else "no", d.bytes, d.sha256[:16], d.tokens, d.skipped_records,
                      "yes" if d.cleaned is not None else "no"]
                     for n, d in lineage.data.items()])
    hygiene = {k: v for k, v in lineage.hygiene.items() if v or k.endswith("records_in")}
    if hygiene:
        lines += ["Hygiene counts (what was found and handled, never the values):", ""]
        lines += _table(["check", "count"], [[k, v] for k, v in sorted(hygiene.items())])
    lines += ["## Evaluation", ""]
    if ev.markdown:
        lines += [f"Held-out and task metrics; deltas are against `{ev.baseline}` (the starting checkpoint).", "",
                  ev.markdown.rstrip(), ""]
    else:
        lines += ["No evaluation suite ran.", ""]
    if ev.gates:
        lines += ["Gates:", ""] + [f"- {g.text}" for g in ev.gates] + [""]
    if ev.alias:
        lines += [f"Registry: {ev.alias}", ""]
    compute = lineage.compute or {}
    if compute:
        lines += ["## Compute", ""]
        lines += _table(["stage", "target", "planned steps", "measured steps", "planned tokens", "measured tokens",
                         "planned hours (target)", "measured train hours (here)"],
                        [[n, _or_dash(c.target), _or_dash(c.planned_steps), c.steps, _or_dash(c.planned_tokens),
                          c.tokens, _or_dash(c.planned_hours), c.train_hours] for n, c in compute.items()])
    lines += ["## Limitations", ""]
    auto = ["Evaluated on held-out documents of the same sources it was trained on and on the recipe's task sets "
            "only; that says little about other domains."]
    if any(not g.passed for g in ev.gates):
        auto.append("At least one gate failed (above): this version was not given the deployment alias.")
    if ev.skipped:
        auto.append(f"Skipped for the time budget: {', '.join(ev.skipped)}.")
    lines += [f"- {x}" for x in [*auto, *(limitations or [])]] + [""]
    return scrub("\n".join(lines))


def _or_dash(v: Any) -> Any:
    return "-" if v is None else v


def write_model_card(novella: Path, lineage: Lineage, intended_use: str | None = None,
                     limitations: list[str] | None = None) -> Path:
    path = Path(novella) / "MODEL_CARD.md"
    path.write_text(model_card(lineage, intended_use, limitations))
    return path
