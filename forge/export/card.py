"""MODEL_CARD.md for an export: what the model is, where it came from (lineage), how to load and
deploy it (what its format says: forge.export.formats); scrubbed by forge.scrub."""
from __future__ import annotations

from forge.export.formats import Format
from forge.lineage import Lineage
from forge.scrub import scrub


def model_card(name: str, lineage: Lineage | None, config: dict, info: dict, fmt: Format) -> str:
    lines = [f"# {name}", "",
             f"A {info['architecture']} model ({info['parameters']:,} parameters, {info['dtype']} weights, "
             f"context {config.get('max_position_embeddings', config.get('n_positions', '?'))}) exported by forge "
             f"in the {fmt.card} layout. `forge-manifest.json` holds the sha256 of every file and the full lineage.", ""]
    if lineage:
        base = lineage.base.spec
        lines += ["## Lineage", "", f"- recipe: `{lineage.name}` (created {lineage.created}, "
                  f"forge {lineage.forge_version})",
                  f"- base: `{base if isinstance(base, str) else 'built from scratch: ' + str(base)}`", ""]
        if lineage.stages:
            lines += ["| stage | kind | steps | tokens | final metrics |", "|---|---|---|---|---|"]
            for s in lineage.stages:
                tokens = sum(s.tokens_by_source.values())
                metrics = ", ".join(f"{k}={v:.4g}" for k, v in s.metrics.items() if k in ("loss", "eval_loss"))
                lines.append(f"| {s.name} | {s.kind} | {s.steps} | {tokens:,} | {metrics} |")
            lines.append("")
        if lineage.data:
            lines += ["| data source | proprietary | tokens trained | sha256 |", "|---|---|---|---|"]
            for n, d in sorted(lineage.data.items()):
                lines.append(f"| {n} | {'yes' if d.proprietary else 'no'} | {d.tokens:,} | `{d.sha256[:16]}` |")
            lines.append("")
    else:
        lines += ["## Lineage", "", "Not recorded (the source was not a forge Novella).", ""]
    template = {"model": "the model's own", "given": "supplied at export",
                "default": "forge's generic `role: content` template (the model had none)",
                "none": "none"}[info["chat_template"]]
    lines += ["## Use", "", f"- chat template: {template}",
              "- load: `AutoModelForCausalLM.from_pretrained(folder)` (transformers 4.51.3 or later)",
              *fmt.use, "",
              "Intended use and limitations follow from the data above: the model knows what it was trained "
              "on and nothing newer; evaluate it on your own tasks before use.", ""]
    return scrub("\n".join(lines))
