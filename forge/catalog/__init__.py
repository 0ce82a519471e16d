"""The foundation catalog: phase-tagged checkpoints of each family (pretrained, mid-trained,
post-trained and finer phases), the curated data each phase was trained on, and where they live
(Hub repositories at pinned revisions, folders registered with `forge catalog add`, or forge's
offline family built on first use under FORGE_HOME). A recipe names a phase as
`base: catalog://FAMILY@PHASE` and a curated set as `source: curated://FAMILY/NAME`.

    resolve(ref) -> CatalogPhase        checkpoint(ref, log) -> Path (downloads a Hub phase once)
    curated(ref) -> CuratedSet          unbuilt(ref) -> the pipeline that builds its family, or None
    missing(phase) -> why its local folder is gone, or None
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from forge.catalog import hub
from forge.catalog.entries import (  # noqa: F401  (the catalog's public names)
    INSTRUCTIONS,
    POINTS,
    PURPOSES,
    CatalogPhase,
    CuratedSet,
    Family,
    curated,
    families,
    family,
    family_of,
    forge_home,
    missing,
    parse_ref,
    resolve,
)
from forge.catalog.store import add, known_architectures, remove  # noqa: F401
from forge.errors import ForgeError

__all__ = ["INSTRUCTIONS", "POINTS", "PURPOSES", "CatalogPhase", "CuratedSet", "Family", "add", "build_home",
           "build_note", "cached", "checkpoint", "curated", "families", "family", "family_of", "forge_home",
           "is_ref", "known_architectures", "missing", "params", "parse_ref", "planning_config", "remove", "resolve",
           "summary", "unbuilt"]


def is_ref(base: Any) -> bool:
    return isinstance(base, str) and base.strip().startswith("catalog://")


def checkpoint(ref: str, log: Callable[[str], None] | None = None) -> Path:
    """A local folder for the phase `ref` names: a Hub phase downloaded once at its pinned revision
    (HF_HUB_OFFLINE honoured), a registered folder as it is, a built family's phase from its home."""
    return hub.checkpoint(resolve(ref), log)


def cached(phase: CatalogPhase) -> Path | None:
    """The phase's local folder if it is there without downloading anything, else None."""
    if not phase.built:
        return None
    if phase.hub is None:
        return phase.path if phase.path is not None and (phase.path / "config.json").is_file() else None
    try:
        return hub.checkpoint(phase, download=False)
    except ForgeError:
        return None


def unbuilt(ref: Any) -> str | None:
    """The pipeline that builds the family a catalog:// or curated:// reference names, when that
    family is buildable and not built yet (e.g. "foundation"); None otherwise."""
    name = family_of(ref)
    fams = families() if name else {}
    fam = fams.get(name or "")
    return fam.build if fam is not None and fam.build and not fam.built else None


def build_home(ref: str) -> Path:
    """Where the family `ref` names is built and cached (FORGE_HOME/foundations/NAME)."""
    fam = family(family_of(ref) or "")
    if fam.home is None:
        raise ForgeError(f"catalog family {fam.name!r} is not built by forge")
    return fam.home


def build_note(ref: str) -> str:
    """What `forge validate` says of a base or source whose family is not built yet."""
    fam = family(family_of(ref) or "")
    minutes = f" (about {fam.build_minutes} minutes on a 2-core CPU)" if fam.build_minutes else ""
    also = f", or build it now with forge run {fam.build_recipe}" if fam.build_recipe else ""
    return (f"catalog family {fam.name!r} is not built yet: the first `forge run` of this recipe builds it "
            f"once{minutes} into {fam.home}{also}")


def planning_config(ref: str) -> str | dict[str, Any]:
    """What the planner reads for the phase's model: its local config.json folder when it is on
    disk, else the forge plan preset the catalog names for it."""
    phase = resolve(ref)
    folder = cached(phase)
    if folder is not None:
        return str(folder)
    if phase.planner:
        return phase.planner
    gone = missing(phase)
    if gone:
        raise ForgeError(gone)
    if not phase.built:
        raise ForgeError(f"{ref}: {build_note(ref)}; forge plan needs its config.json")
    raise ForgeError(f"{ref}: its config.json is not downloaded yet (hf://{phase.hub}@{phase.revision}); "
                     "the first `forge run` fetches it, after which forge plan reads it")


def params(ref: str) -> dict[str, str]:
    """The MLflow params of a catalog base (beside the `base` summary)."""
    phase = resolve(ref)
    return {"base.family": phase.family, "base.phase": phase.phase, "base.point": phase.point,
            "base.location": phase.location}


def summary(ref: str) -> str:
    """The base in one line: its reference, point and location."""
    phase = resolve(ref)
    return f"{ref} ({phase.point}; {phase.location})"
