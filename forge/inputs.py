"""The one adapter from a recipe to what stages consume: data sources (read, fingerprinted and
cleaned by hygiene), and the base checkpoint (a folder, or a tiny model built from a config)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from forge.data.prepare import clean_sources
from forge.data.sources import Source, resolve_source
from forge.recipe import Recipe
from forge.scratch import build_scratch_base, scratch_key


@dataclass
class Inputs:
    raw: dict[str, Source]          # the sources as the recipe names them
    fingerprints: dict[str, str]    # content hash of each raw source
    sources: dict[str, Source]      # what stages read: hygiene's cleaned cache where it applies
    hygiene: dict[str, int]         # hygiene counts (never the values found)
    base: Path                      # the first stage's input checkpoint


def prepare_inputs(recipe: Recipe, out: Path) -> Inputs:
    """Read and clean the recipe's data under `out/data` and make the base (rank 0 writes; call it
    inside `main_process_first()` when several processes run)."""
    raw = {name: resolve_source(name, cfg, out / "data") for name, cfg in recipe.data.items()}
    fingerprints = {name: src.fingerprint() for name, src in raw.items()}
    sources, hygiene = clean_sources(recipe.hygiene, raw, recipe.data, fingerprints, out / "data")
    if isinstance(recipe.base, str):
        base = Path(recipe.base)
    else:
        scratch = recipe.base.scratch
        key = scratch_key(scratch, [fingerprints[n] for n in scratch.tokenizer_sources])
        base = build_scratch_base(scratch, [sources[n] for n in scratch.tokenizer_sources], out / f"base-{key}")
    return Inputs(raw, fingerprints, sources, hygiene, base)


def input_fingerprints(recipe: Recipe, inputs: Inputs) -> dict[str, str]:
    """{'data.<name>': sha256, 'base': sha256} for a run folder's record (a scratch base is fixed
    by the recipe and its data, so it needs none of its own)."""
    from forge.rundir import base_fingerprint

    out = {f"data.{name}": fp for name, fp in inputs.fingerprints.items()}
    if isinstance(recipe.base, str):
        out["base"] = base_fingerprint(inputs.base)
    return out
