"""Thin adapter from a forge recipe to planner workloads: `plan_recipe(recipe, ...)`.

Reads only: recipe.base (checkpoint path / preset name, or an object with .hf_config(), directly
or as .scratch.hf_config()),
recipe.compute.target / .chips, and per stage .name, .kind, .seq_len, .batch_size, .grad_accum,
.max_tokens / .max_steps, .precision. Stage kinds that do not exist yet may carry optional
fields the planner reads when present (getattr with a default, listed in _optional):
  sft: packed (True), mean_example_len
  dpo: pairs, cache_reference (True), epochs (1)       -- batch_size counts pairs
  rft: prompt_len (seq_len // 4), gen_len (rest of seq_len), group_size (8), reward_model (False)
"""
from __future__ import annotations

from forge.errors import ForgeError
from forge.plan import workloads as W
from forge.plan.hardware import load_catalog, parse_targets
from forge.plan.model import load_model_config
from forge.plan.planner import StagePlan, compare


def _optional(stage, name: str, default):
    return getattr(stage, name, default)


def recipe_model_config(recipe) -> dict:
    base = recipe.base
    if hasattr(base, "scratch") and hasattr(base.scratch, "hf_config"):
        base = base.scratch                        # forge.recipe.Base wraps the scratch model
    if hasattr(base, "hf_config"):
        return dict(base.hf_config())
    for attr in ("path", "checkpoint"):            # a typed base may wrap the path
        if hasattr(base, attr) and isinstance(getattr(base, attr), str):
            base = getattr(base, attr)
    if not isinstance(base, str):
        raise ForgeError("recipe.base must be a checkpoint path or a model built from a config")
    return load_model_config(base)


def stage_workload(stage, dp_world: int = 1, precision: str | None = None) -> W.Workload:
    """One recipe stage as a Workload. Global batch = batch_size * grad_accum * dp_world."""
    kind = W.normalize_kind(stage.kind)
    seq = int(stage.seq_len)
    batch = int(stage.batch_size) * int(getattr(stage, "grad_accum", 1) or 1) * max(1, dp_world)
    tokens, steps = getattr(stage, "max_tokens", None), getattr(stage, "max_steps", None)
    prec = precision or getattr(stage, "precision", None) or "bf16"
    name = str(stage.name)
    if kind in ("pretrain", "midtrain"):
        return W.pretrain(name, seq, batch, tokens, steps, prec, kind=kind)
    if kind == "sft":
        return W.sft(name, seq, batch, tokens, steps, prec, packed=bool(_optional(stage, "packed", True)),
                     mean_example_len=_optional(stage, "mean_example_len", None))
    if kind == "dpo":
        pairs = _optional(stage, "pairs", None) or (tokens / (2 * seq) if tokens else None)
        return W.dpo(name, seq, batch, pairs, steps, prec,
                     cached_reference=bool(_optional(stage, "cache_reference", True)),
                     epochs=int(_optional(stage, "epochs", 1)))
    prompt = int(_optional(stage, "prompt_len", seq // 4))
    gen = int(_optional(stage, "gen_len", seq - prompt))
    group = int(_optional(stage, "group_size", 8))
    if not steps:
        if not tokens:
            raise ForgeError(f"stage {name!r}: give max_steps (or max_tokens) for the planner")
        steps = max(1, int(tokens // (batch * gen)))
    return W.rft(name, prompt, gen, max(1, batch // group), group, int(steps), prec,
                 reward_model=bool(_optional(stage, "reward_model", False)))


def plan_recipe(recipe, target: str | None = None, chips: int | None = None, deadline_h: float | None = None,
                budget_usd: float | None = None, mfu: float | None = None, precision: str | None = None,
                catalog: dict | None = None, stack: str | None = None) -> list[StagePlan]:
    """Plan every stage of `recipe` on `target` (default: recipe.compute.target; a comma list
    'trn3,trn2,h100:64' compares several). Returns one StagePlan per (stage, target)."""
    compute = getattr(recipe, "compute", None)
    own_target = getattr(compute, "target", None) or "local"
    own_chips = getattr(compute, "chips", None)
    calibration = getattr(compute, "calibration", None)      # applied only where the recipe asks
    catalog = catalog if catalog is not None else load_catalog((calibration,) if calibration else ())
    config = recipe_model_config(recipe)
    targets = parse_targets(target or own_target)
    plans = []
    for stage in recipe.stages:
        wl = stage_workload(stage, own_chips or 1, precision)
        for name, per_target_chips in targets:
            n = chips or per_target_chips or (own_chips if name == own_target else None)
            plans += compare(config, wl, [(name, n)], deadline_h=deadline_h, budget_usd=budget_usd, mfu=mfu,
                             catalog=catalog, stack=stack or getattr(compute, "stack", None))
    return plans
