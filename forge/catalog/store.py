"""`forge catalog add` / `remove`: register a local checkpoint folder (a company's own model, an
earlier Novella) as a phase of a family, after checking that it loads, has a tokenizer and an
architecture forge knows; registrations live in FORGE_HOME/catalog.yaml, built-in phases stay."""
from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import yaml

from forge.base_check import check_base
from forge.catalog.entries import POINTS, CatalogPhase, bedrock_architectures, families, local_facts, \
    read_registrations, registrations_file
from forge.errors import ForgeError

_NAME = r"^[a-z0-9][a-z0-9._-]*$"


def known_architectures() -> frozenset[str]:
    """Causal-LM architectures forge trains: Bedrock's list (forge/export/bedrock.yaml, seq2seq
    left out) and those of the built-in families."""
    causal = {a for a in bedrock_architectures() if a.endswith("ForCausalLM")}
    builtin = {ph.architecture for f in families().values() for ph in f.phases.values()
               if ph.origin == "built-in" and ph.architecture}
    return frozenset(causal | builtin)


def split_ref(spec: str) -> tuple[str, str]:
    """'FAMILY@PHASE' (or catalog://FAMILY@PHASE) as its two names, each a lowercase slug."""
    import re

    text = spec.removeprefix("catalog://")
    family, at, phase = text.partition("@")
    if not at or not re.match(_NAME, family) or not re.match(_NAME, phase):
        raise ForgeError(f"{spec!r}: expected FAMILY@PHASE (lowercase letters, digits, '.', '_', '-'), "
                         "e.g. acme@post-trained")
    return family, phase


def _check_folder(folder: Path) -> dict[str, Any]:
    """The folder's facts, or a one-line refusal naming what is wrong."""
    if not folder.is_dir():
        raise ForgeError(f"{folder}: no such folder")
    if not (folder / "config.json").is_file():
        raise ForgeError(f"{folder}: no config.json (expected a Hugging Face checkpoint folder)")
    facts = local_facts(folder)
    if not facts:
        raise ForgeError(f"{folder}/config.json: not readable JSON")
    known = known_architectures()
    if facts["architecture"] not in known:
        raise ForgeError(f"{folder}/config.json: architecture {facts['architecture'] or 'none'!r} is not one forge "
                         f"knows; known: {', '.join(sorted(known))}")
    problems = check_base(folder)  # weights as safetensors, complete; tokenizer files present
    if problems:
        raise ForgeError(problems[0] + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""))
    return facts


def _lineage_summary(folder: Path) -> dict[str, Any] | None:
    """Where an earlier Novella came from (its lineage.json): recipe, base, stages, created."""
    path = folder / "lineage.json"
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
        base = data.get("base", {}).get("spec")
    except (OSError, ValueError, AttributeError):
        raise ForgeError(f"{path}: not readable JSON (a Novella's lineage)") from None
    return {"novella": data.get("name", ""), "created": data.get("created", ""),
            "base": base if isinstance(base, str) else "scratch",
            "stages": [f"{s.get('name')}/{s.get('kind')}" for s in data.get("stages", []) if isinstance(s, dict)]}


def add(spec: str, folder: str | Path, point: str | None = None) -> CatalogPhase:
    """Register `folder` as FAMILY@PHASE; the phase's point is --point, else the phase name when it
    is one of the three points."""
    family, phase = split_ref(spec)
    point = point or (phase if phase in POINTS else None)
    if point not in POINTS:
        raise ForgeError(f"{family}@{phase}: give --point (one of {', '.join(POINTS)}): which starting point "
                         "this checkpoint is")
    fams = families()
    if family in fams and phase in fams[family].phases:
        existing = fams[family].phases[phase]
        if existing.origin != "registered":
            raise ForgeError(f"{family}@{phase} is a built-in phase; register yours under another phase name")
        raise ForgeError(f"{family}@{phase} is already registered ({existing.location}); "
                         f"forge catalog remove {family}@{phase} first")
    folder = Path(folder).expanduser().resolve()
    facts = _check_folder(folder)
    entry: dict[str, Any] = {"point": point, "path": str(folder), **{k: v for k, v in facts.items() if v},
                             "registered": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")}
    origin = _lineage_summary(folder)
    if origin:
        entry["registered_from"] = origin
    regs = read_registrations()
    regs.setdefault(family, {}).setdefault("phases", {})[phase] = entry
    _write(regs)
    return families()[family].phases[phase]


def remove(spec: str) -> CatalogPhase:
    family, phase = split_ref(spec)
    fams = families()
    if family not in fams or phase not in fams[family].phases:
        known = [f"{f}@{p}" for f, fam in fams.items() for p, ph in fam.phases.items() if ph.origin == "registered"]
        raise ForgeError(f"{family}@{phase} is not registered; registered phases: {', '.join(known) or 'none'}")
    found = fams[family].phases[phase]
    if found.origin != "registered":
        raise ForgeError(f"{family}@{phase} is a built-in phase and cannot be removed "
                         "(only phases added with forge catalog add can)")
    regs = read_registrations()
    del regs[family]["phases"][phase]
    if not regs[family]["phases"]:
        del regs[family]
    _write(regs)
    return found


def _write(regs: dict[str, Any]) -> None:
    path = registrations_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    header = "# forge catalog registrations (forge catalog add / remove write this file)\n"
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(header + yaml.safe_dump({"families": regs}, sort_keys=False))
    tmp.replace(path)  # atomic: a reader sees the old file or the new one
