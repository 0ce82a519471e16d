"""`forge catalog add` / `remove`: register a local checkpoint folder (a company's own model, an
earlier Novella) as a phase of a family, after checking that it loads, has a tokenizer and an
architecture forge knows; registrations live in FORGE_HOME/catalog.yaml, built-in phases stay.
Each change of catalog.yaml reads, changes and replaces the file under an exclusive lock on
catalog.yaml.lock beside it, so parallel adds and removes all land and a reader sees the old file
or the new one, never half of one."""
from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import os
import tempfile
from pathlib import Path
from typing import Any, Iterator

import yaml

from forge.base_check import check_base, read_json
from forge.catalog import registry
from forge.catalog.entries import (
    POINTS,
    CatalogPhase,
    bedrock_architectures,
    families,
    local_facts,
    read_registrations,
    registrations_file,
)
from forge.errors import ForgeError


def known_architectures() -> frozenset[str]:
    """Causal-LM architectures forge trains: Bedrock's list (forge/export/bedrock.yaml, seq2seq
    left out) and those of the built-in families."""
    causal = {a for a in bedrock_architectures() if a.endswith("ForCausalLM")}
    builtin = {ph.architecture for f in families().values() for ph in f.phases.values()
               if ph.origin == "built-in" and ph.architecture}
    return frozenset(causal | builtin)


def split_ref(spec: str) -> tuple[str, str]:
    """'FAMILY@PHASE' (or catalog://FAMILY@PHASE) as its two names, each a lowercase slug matched
    whole (a trailing newline or an '@' in either name is refused)."""
    text = spec.removeprefix("catalog://")
    family, at, phase = text.partition("@")
    if not at or not registry.valid_name(family) or not registry.valid_name(phase):
        raise ForgeError(f"{spec!r}: expected FAMILY@PHASE, each name {registry.NAME_RULE} characters, "
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
        data = read_json(path)
        base = data.get("base", {}).get("spec")
    except (OSError, ValueError, AttributeError):
        raise ForgeError(f"{path}: not readable JSON (a Novella's lineage)") from None
    stages = data.get("stages")
    return {"novella": str(data.get("name", "")), "created": str(data.get("created", "")),
            "base": base if isinstance(base, str) else "scratch",
            "stages": [f"{s.get('name')}/{s.get('kind')}" for s in stages if isinstance(s, dict)]
            if isinstance(stages, list) else []}


def add(spec: str, folder: str | Path, point: str | None = None) -> CatalogPhase:
    """Register `folder` as FAMILY@PHASE; the phase's point is --point, else the phase name when it
    is one of the three points."""
    family, phase = split_ref(spec)
    point = point or (phase if phase in POINTS else None)
    if point not in POINTS:
        raise ForgeError(f"{family}@{phase}: give --point (one of {', '.join(POINTS)}): which starting point "
                         "this checkpoint is")
    _refuse_taken(family, phase)  # early, before the folder is read; again under the lock
    try:
        folder = Path(folder).expanduser().resolve(strict=False)
    except RuntimeError:  # what Python before 3.13 raises for a symlink loop
        raise ForgeError(f"{folder}: a symlink loop (a link on that path leads back to itself)") from None
    except OSError as e:
        raise ForgeError(f"{folder}: cannot be resolved ({e.strerror or e})") from None
    facts = _check_folder(folder)
    entry: dict[str, Any] = {"point": point, "path": str(folder), **{k: v for k, v in facts.items() if v},
                             "registered": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")}
    origin = _lineage_summary(folder)
    if origin:
        entry["registered_from"] = origin
    with _locked():
        _refuse_taken(family, phase)
        regs = read_registrations()
        regs.setdefault(family, {}).setdefault("phases", {})[phase] = entry
        _write(regs)
        return families()[family].phases[phase]


def _refuse_taken(family: str, phase: str) -> None:
    fams = families()
    if family in fams and phase in fams[family].phases:
        existing = fams[family].phases[phase]
        if existing.origin != "registered":
            raise ForgeError(f"{family}@{phase} is a built-in phase; register yours under another phase name")
        raise ForgeError(f"{family}@{phase} is already registered ({existing.location}); "
                         f"forge catalog remove {family}@{phase} first")


def remove(spec: str) -> CatalogPhase:
    family, phase = split_ref(spec)
    with _locked():
        return _remove(family, phase)


def _remove(family: str, phase: str) -> CatalogPhase:
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


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    """An exclusive lock on catalog.yaml.lock beside catalog.yaml for one read-change-write (the
    lock file stays: removing it would let two processes lock two different files)."""
    path = registrations_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _write(regs: dict[str, Any]) -> None:
    """Replace catalog.yaml by a rename from a uniquely named file beside it (removed on any error)."""
    path = registrations_file()
    header = "# forge catalog registrations (forge catalog add / remove write this file)\n"
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(header + yaml.safe_dump({"families": regs}, sort_keys=False))
            f.flush()
            os.fsync(f.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes it owner-only; the file is as readable as any other
        os.replace(tmp, path)  # atomic: a reader sees the old file or the new one
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
