"""Starting-point advice for a recipe on a catalog base, printed as warnings (never failures) by
`forge validate` and `forge plan`: whether the phase fits the amount of proprietary data (Nova
Forge's rule, scaled to the model at hand), and whether a post-trained base is continued-pretrained
without replaying its instruction data. Stage kinds are asked through the kinds table."""
from __future__ import annotations

from typing import Any

from forge import catalog
from forge.errors import ForgeError
from forge.kinds import row, trains
from forge.recipe.settings import mixture_warnings

# AWS's guidance for Nova Forge: with about 10B tokens or more of your own data start from a pre- or
# mid-trained checkpoint, with less from the post-trained one. The rule is stated for Nova models;
# forge scales it with the model's Chinchilla-optimal token count D* = 20 N (Hoffmann et al. 2022,
# "Training Compute-Optimal Large Language Models", arXiv:2203.15556): 10B tokens is 1/16 of D* for
# an 8B-parameter model, the size class the rule is taken to describe (Nova Lite's parameter count is
# not published), so the threshold is D*(N) / 16 = 1.25 tokens per parameter.
NOVA_TOKENS = 10e9
TOKENS_PER_PARAM = 20          # Chinchilla-optimal tokens per parameter
REFERENCE_PARAMS = 8e9         # the model size the 10B-token rule is read for


def threshold(parameters: int) -> float:
    """Proprietary tokens from which an earlier (pre-/mid-trained) checkpoint is the better start."""
    return NOVA_TOKENS * (TOKENS_PER_PARAM * parameters) / (TOKENS_PER_PARAM * REFERENCE_PARAMS)


def proprietary_tokens(recipe: Any) -> float:
    """Proprietary tokens the recipe trains on: each training stage's token budget (max_tokens, or
    max_steps x tokens per step) times the proprietary share of its sources' weights."""
    total = 0.0
    for stage in recipe.stages:
        weights = stage.sources
        if not trains(stage) or not weights:
            continue
        budget = stage.max_tokens or stage.total_steps() * stage.tokens_per_step
        mine = sum(w for name, w in weights.items() if name in recipe.data and recipe.data[name].proprietary)
        total += budget * mine / sum(weights.values())
    return total


def _count(n: float) -> str:
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.3g}{unit}"
    return f"{n:.0f}"


def _point_fit(recipe: Any, phase: catalog.CatalogPhase) -> list[str]:
    if not phase.parameters:
        return []
    tokens, limit = proprietary_tokens(recipe), threshold(phase.parameters)
    scale = (f"Nova's ~10B-token rule scaled to this {_count(phase.parameters)}-parameter model: "
             f"{_count(limit)} tokens, 1/16 of its Chinchilla-optimal 20 tokens per parameter")
    others = catalog.family(phase.family).phases.values()
    if phase.point != "post-trained" and tokens < limit:
        alt = [p.ref for p in others if p.point == "post-trained"]
        return [f"base {phase.ref} starts from a {phase.point} checkpoint, but the recipe trains on about "
                f"{_count(tokens)} proprietary tokens (stage budgets x proprietary shares), fewer than {scale}; "
                "with that little data start from a post-trained checkpoint"
                + (f" ({', '.join(alt)})" if alt else "") + " and keep its skills"]
    if phase.point == "post-trained" and tokens >= limit:
        alt = [p.ref for p in others if p.point != "post-trained"]
        return [f"base {phase.ref} is post-trained, but the recipe trains on about {_count(tokens)} proprietary "
                f"tokens, at least {scale}; with that much data start from a pre- or mid-trained checkpoint"
                + (f" ({', '.join(alt)})" if alt else "") + " and align afterwards"]
    return []


def _replays_sft(recipe: Any, stage: Any) -> bool:
    for name in stage.sources:
        ref = getattr(recipe.data.get(name), "source", None)
        try:
            if ref and catalog.curated(ref).purpose == catalog.INSTRUCTIONS:
                return True
        except ForgeError:
            continue
    return False


def _unreplayed(recipe: Any, phase: catalog.CatalogPhase) -> list[str]:
    if phase.point != "post-trained":
        return []
    sets = [c.ref for c in catalog.family(phase.family).curated.values() if c.purpose == catalog.INSTRUCTIONS]
    hint = (f"add its curated instruction set to the mixture (data.NAME.source: {sets[0]})" if sets
            else "mix instruction data into it")
    return [f"stages[{i}] ({stage.name}) continued-pretrains a post-trained base ({phase.ref}) without replaying "
            f"its instruction data: the instruction-following it was aligned for is likely to fade; {hint}, "
            "or follow it with an sft stage"
            for i, stage in enumerate(recipe.stages)
            if trains(stage) and row(stage).data == "text" and not _replays_sft(recipe, stage)]


def warnings(recipe: Any) -> list[str]:
    """The advice for a recipe: mixture weights that are shares only once normalized, and for a
    catalog base whether its phase fits the data."""
    mixtures = mixture_warnings(recipe.stages)
    if not catalog.is_ref(recipe.base):
        return mixtures
    phase = catalog.resolve(recipe.base)
    return mixtures + _point_fit(recipe, phase) + _unreplayed(recipe, phase)


def unbuilt(recipe: Any) -> dict[str, str]:
    """{reference: pipeline} for each family the recipe's base or curated sources need built first
    (one reference per family)."""
    refs = [recipe.base] + [cfg.source for cfg in recipe.data.values() if cfg.source]
    out: dict[str, str] = {}
    for ref in refs:
        name = catalog.unbuilt(ref)
        if name and catalog.family_of(ref) not in {catalog.family_of(r) for r in out}:
            out[ref] = name
    return out
