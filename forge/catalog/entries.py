"""The catalog's records and where they come from: the built-in families (families.yaml), the
registrations `forge catalog add` wrote (FORGE_HOME/catalog.yaml), and a built offline family's
`foundation.json`; read into Family / CatalogPhase / CuratedSet, with references parsed and every
unknown family, phase or set refused with the list of what exists."""
from __future__ import annotations

import functools
import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from forge.base_check import TOKENIZER_FILES, open_regular, read_header, read_json
from forge.catalog import registry
from forge.errors import ForgeError

POINTS = ("pretrained", "mid-trained", "post-trained")     # Nova's three starting points
PURPOSES = ("pretraining", "mid-training", "sft", "preference")   # what a curated set is for
INSTRUCTIONS = PURPOSES[2]   # the purpose of a family's instruction (SFT) data: what replay keeps aligned
BUILTIN_FILE = Path(__file__).with_name("families.yaml")
# Bedrock's supported architectures live in the export's data file (one list, not retyped here);
# read as data, so this low layer does not import forge.export
BEDROCK_FILE = Path(__file__).resolve().parents[1] / "export" / "bedrock.yaml"
_REF = re.compile(r"^catalog://(?P<family>[^@/\s]+)@(?P<phase>[^@/\s]+)$")
_CURATED = re.compile(r"^curated://(?P<family>[^@/\s]+)/(?P<name>[^@/\s]+)$")


def forge_home() -> Path:
    """FORGE_HOME, else `.forge/` in the working directory (never the user's home folder): the
    built offline foundations, `forge catalog add` registrations and, unless HF_HUB_CACHE/HF_HOME
    say otherwise, the Hub download cache."""
    env = os.environ.get("FORGE_HOME")
    return Path(env).expanduser().resolve() if env else Path.cwd().resolve() / ".forge"


@functools.cache
def bedrock_architectures() -> frozenset[str]:
    return frozenset(yaml.safe_load(BEDROCK_FILE.read_text())["architectures"])


@dataclass(frozen=True)
class CuratedSet:
    """A curated dataset a family offers for replay: on the Hub at a pinned revision, or local files."""

    family: str
    name: str
    purpose: str
    hub: str | None = None
    revision: str | None = None
    data_files: str | None = None
    split: str = "train"
    path: Path | None = None          # local files (a built offline family)
    holdout: float | None = None      # the fraction its family holds out (local sets say it)
    text_field: str | None = None
    chat: dict[str, Any] | None = None
    stand_in: bool = False
    licence: str = ""
    cite: str = ""
    note: str = ""

    @property
    def ref(self) -> str:
        return f"curated://{self.family}/{self.name}"

    @property
    def location(self) -> str:
        if self.hub:
            return f"hf://datasets/{self.hub}@{self.revision}" + (f" ({self.data_files})" if self.data_files else "")
        return str(self.path) if self.path else "(built with its family)"


@dataclass(frozen=True)
class CatalogPhase:
    """One phase checkpoint of a family: where it lives and what it is."""

    family: str
    phase: str
    point: str
    hub: str | None = None
    revision: str | None = None
    path: Path | None = None           # a local folder (registered, or a built family's phase)
    architecture: str = ""
    parameters: int | None = None
    context: int | None = None
    tokenizer: str = ""
    licence: str = ""
    curated: tuple[str, ...] = ()
    cite: str = ""
    origin: str = "built-in"           # built-in | registered | built
    built: bool = True                 # False: its family must be built first (see Family.build)
    planner: str | None = None         # a forge plan preset for its config when not downloaded
    tokenizer_from: dict[str, str] | None = None
    registered_from: dict[str, Any] | None = None   # a registered Novella's lineage summary

    @property
    def ref(self) -> str:
        return f"catalog://{self.family}@{self.phase}"

    @property
    def location(self) -> str:
        return f"hf://{self.hub}@{self.revision}" if self.hub else str(self.path)

    @property
    def bedrock(self) -> bool:
        """Whether Bedrock Custom Model Import accepts the architecture (forge/export/bedrock.yaml)."""
        return self.architecture in bedrock_architectures()

    def record(self) -> dict[str, Any]:
        """What the lineage and MLflow keep of it."""
        out: dict[str, Any] = {"ref": self.ref, "family": self.family, "phase": self.phase, "point": self.point,
               "location": self.location, "revision": self.revision or ""}
        if self.registered_from:
            out["registered_from"] = self.registered_from
        return out


@dataclass
class Family:
    name: str
    phases: dict[str, CatalogPhase]
    curated: dict[str, CuratedSet]
    description: str = ""
    licence: str = ""
    origin: str = "built-in"
    build: str | None = None           # the pipeline that builds it (pipelines/<build>.py)
    home: Path | None = None           # where a built family lives
    built: bool = True
    build_minutes: int | None = None
    build_recipe: str | None = None
    corpus: dict[str, Any] | None = None  # a built family's corpus: sha256, each set's, what it was read from


# ------------------------------------------------------------------------------------ reading
def _phase(family: str, name: str, raw: dict[str, Any], origin: str, defaults: dict[str, Any]) -> CatalogPhase:
    point = raw.get("point")
    if point not in POINTS:
        raise ForgeError(f"catalog {family}@{name}: point {point!r}; expected one of {list(POINTS)}")
    return CatalogPhase(
        family=family, phase=name, point=point, hub=raw.get("hub"), revision=raw.get("revision"),
        path=Path(raw["path"]) if raw.get("path") else None, architecture=raw.get("architecture", ""),
        parameters=raw.get("parameters"), context=raw.get("context"),
        tokenizer=raw.get("tokenizer", defaults.get("tokenizer", "")), licence=raw.get("licence", defaults.get("licence", "")),
        curated=tuple(raw.get("curated") or ()), cite=raw.get("cite", ""), origin=origin,
        planner=raw.get("planner"), tokenizer_from=defaults.get("tokenizer_from"),
        registered_from=raw.get("registered_from"))


def _curated(family: str, name: str, raw: dict[str, Any], root: Path | None = None) -> CuratedSet:
    purpose = raw.get("purpose")
    if purpose not in PURPOSES:
        raise ForgeError(f"catalog {family}/{name}: purpose {purpose!r}; expected one of {list(PURPOSES)}")
    path = raw.get("path")
    return CuratedSet(family=family, name=name, purpose=purpose, hub=raw.get("hub"), revision=raw.get("revision"),
                      data_files=raw.get("data_files"), split=raw.get("split", "train"),
                      path=(root / path if root is not None else Path(path)) if path else None,
                      holdout=raw.get("holdout"), text_field=raw.get("text_field"), chat=raw.get("chat"),
                      stand_in=bool(raw.get("stand_in")), licence=raw.get("licence", ""), cite=raw.get("cite", ""),
                      note=raw.get("note", ""))


def _family(name: str, raw: dict[str, Any], origin: str) -> Family:
    defaults = {k: raw.get(k) for k in ("tokenizer", "licence", "tokenizer_from")}
    phases = {p: _phase(name, p, r, origin, defaults) for p, r in (raw.get("phases") or {}).items()}
    curated = {c: _curated(name, c, r) for c, r in (raw.get("curated") or {}).items()}
    fam = Family(name, phases, curated, raw.get("description", ""), raw.get("licence", ""), origin,
                 raw.get("build"), None, True, raw.get("build_minutes"), raw.get("build_recipe"))
    if fam.build:
        fam.home = forge_home() / raw.get("home", f"foundations/{name}")
        _read_built(fam)
    return fam


def _read_built(fam: Family) -> None:
    """A buildable family: its foundation.json, once built, replaces the declared phases and sets."""
    assert fam.home is not None
    manifest = fam.home / "foundation.json"
    if not manifest.is_file():
        fam.built = False
        fam.phases = {p: CatalogPhase(**{**vars(ph), "path": fam.home / p, "origin": "to be built", "built": False})
                      for p, ph in fam.phases.items()}
        return
    declared = declared_points(fam.name)  # families.yaml's point wins over the manifest's: one source
    try:
        data = read_json(manifest)
        phases, curated = data["phases"], data.get("curated") or {}
        fam.curated = {c: _curated(fam.name, c, r, fam.home) for c, r in curated.items()}
        fam.corpus = data.get("corpus")
        fam.phases = {}
        for p, r in phases.items():
            folder = fam.home / r["path"]
            r = {**r, "path": str(folder), "point": declared.get(p, r.get("point"))}
            phase = _phase(fam.name, p, r, "built", {"licence": fam.licence})
            fam.phases[p] = CatalogPhase(**{**vars(phase), **local_facts(folder)})
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise ForgeError(f"{manifest}: not a foundation manifest ({type(e).__name__}: {e}); rebuild it with "
                         f"forge run {fam.build_recipe or 'its recipe'}") from None
    if fam.corpus is not None:
        check_corpus(fam)


def check_corpus(fam: Family) -> None:
    """Each curated set's file still has the sha256 its foundation.json recorded (a set changed or
    cut short since the build is another corpus than the phases were trained on)."""
    assert fam.home is not None and fam.corpus is not None
    sets = fam.corpus.get("sets") if isinstance(fam.corpus, dict) else None
    if not isinstance(sets, dict):
        raise ForgeError(f"{fam.home / 'foundation.json'}: corpus.sets: expected each curated set's sha256")
    for name, want in sorted(sets.items()):
        c = fam.curated.get(name)
        got = file_sha256(c.path) if c is not None and c.path is not None else None
        if got != want:
            where = c.path if c is not None and c.path is not None else f"curated set {name!r}"
            raise ForgeError(f"{where}: its sha256 is {got or 'missing'}, foundation.json recorded {want}: the "
                             f"{fam.name} corpus changed since it was built; remove {fam.home} to build it again")


def file_sha256(path: Path) -> str | None:
    """The file's sha256 (None when it is not a readable regular file), cached by size and mtime."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return _sha256(str(path), st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=64)
def _sha256(path: str, size: int, mtime_ns: int) -> str | None:
    digest = hashlib.sha256()
    try:
        with open_regular(Path(path)) as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
    except OSError:
        return None
    return digest.hexdigest()


def local_facts(folder: Path) -> dict[str, Any]:
    """Architecture, parameters (from the safetensors headers), context and tokenizer of a local folder."""
    try:
        config = read_json(folder / "config.json")
    except (OSError, ValueError):
        return {}
    if not isinstance(config, dict):
        return {}
    tokenizer = next((n for n in TOKENIZER_FILES if (folder / n).is_file()), "")
    archs = config.get("architectures")
    context = config.get("max_position_embeddings") or config.get("n_positions")
    return {"architecture": archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else "",
            "parameters": _parameters(folder),
            "context": context if isinstance(context, int) and not isinstance(context, bool) else None,
            "tokenizer": f"{tokenizer} in the folder" if tokenizer else ""}


def _parameters(folder: Path) -> int | None:
    """Element count of every tensor in the folder's safetensors files, read from their headers
    (None when one is not a sound safetensors file: forge.base_check says why)."""
    total = 0
    for path in sorted(folder.glob("*.safetensors")):
        try:
            header = read_header(path)[0]
            for name, info in header.items():
                if name != "__metadata__":
                    count = 1
                    for d in info.get("shape", []):
                        count *= int(d)
                    total += count
        except (OSError, ValueError, TypeError, AttributeError):
            return None
    return total or None


def declared_points(name: str) -> dict[str, str]:
    """phase -> point of a built-in family as families.yaml declares them: the one source of each
    phase's point (a built family's foundation.json does not override it)."""
    raw = yaml.safe_load(BUILTIN_FILE.read_text())["families"][name]
    return {p: r["point"] for p, r in (raw.get("phases") or {}).items()}


def registrations_file() -> Path:
    return forge_home() / "catalog.yaml"


def read_registrations() -> dict[str, Any]:
    """catalog.yaml's registered families, checked (forge.catalog.registry); {} when there is none."""
    path = registrations_file()
    if not os.path.lexists(path):
        return {}
    try:
        with open_regular(path) as f:
            data = yaml.safe_load(f.read().decode("utf-8")) or {}
    except (UnicodeDecodeError, yaml.YAMLError) as e:
        first = str(e).replace("\n", " ")[:160]
        raise ForgeError(f"{path}: not readable YAML ({first})") from None
    except OSError as e:  # a folder, a FIFO, a dangling link: the file the catalog keeps is not there
        raise ForgeError(f"{path}: {e.strerror or str(e).removeprefix(f'{path}: ')}; it should be the file "
                         "forge catalog add writes (move it aside)") from None
    fams = data.get("families") if isinstance(data, dict) else None
    if not isinstance(fams, dict):
        raise ForgeError(f"{path}: expected a mapping 'families:' of registered families")
    wrong = registry.problem(fams, POINTS)
    if wrong:
        raise ForgeError(f"{path}: {wrong}; fix or remove that entry")
    return fams


def families() -> dict[str, Family]:
    """Every family: built-in (with a built family's manifest) and registered phases merged in."""
    builtin = yaml.safe_load(BUILTIN_FILE.read_text())["families"]
    out = {name: _family(name, raw, "built-in") for name, raw in builtin.items()}
    for name, raw in read_registrations().items():
        reg = _family(name, {**raw, "build": None}, "registered")
        if name in out:
            out[name].phases.update({p: ph for p, ph in reg.phases.items() if p not in out[name].phases})
        else:
            out[name] = reg
    return out


# ------------------------------------------------------------------------------------ lookups
def parse_ref(ref: str) -> tuple[str, str]:
    m = _REF.match(ref.strip()) if isinstance(ref, str) else None
    if m is None:
        raise ForgeError(f"base: {ref!r} is not a catalog reference; expected catalog://FAMILY@PHASE "
                         "(forge catalog list shows them)")
    return m["family"], m["phase"]


def family(name: str, field_name: str = "base") -> Family:
    fams = families()
    if name not in fams:
        raise ForgeError(f"{field_name}: no catalog family {name!r}; known: {', '.join(sorted(fams))} "
                         "(forge catalog add FAMILY@PHASE PATH registers one)")
    return fams[name]


def resolve(ref: str) -> CatalogPhase:
    """The phase a `catalog://FAMILY@PHASE` reference names; unknown ones are refused with what exists."""
    fam_name, phase = parse_ref(ref)
    fam = family(fam_name)
    if phase not in fam.phases:
        raise ForgeError(f"base: family {fam_name!r} has no phase {phase!r}; its phases: "
                         f"{', '.join(f'{p} ({ph.point})' for p, ph in fam.phases.items())}")
    return fam.phases[phase]


def curated(ref: str) -> CuratedSet:
    """The set a `curated://FAMILY/NAME` reference names; unknown ones are refused with what exists."""
    m = _CURATED.match(ref.strip()) if isinstance(ref, str) else None
    if m is None:
        raise ForgeError(f"source: {ref!r} is not a curated reference; expected curated://FAMILY/NAME")
    fam = family(m["family"], "source")
    if m["name"] not in fam.curated:
        raise ForgeError(f"source: family {m['family']!r} has no curated set {m['name']!r}; its sets: "
                         + (", ".join(f"{c} ({s.purpose})" for c, s in fam.curated.items()) or "none"))
    return fam.curated[m["name"]]


def family_of(ref: Any) -> str | None:
    """The family a catalog:// or curated:// reference names (None for anything else)."""
    if not isinstance(ref, str):
        return None
    m = _REF.match(ref.strip()) or _CURATED.match(ref.strip())
    return m["family"] if m else None


def missing(phase: CatalogPhase) -> str | None:
    """Why the local folder of a registered or built phase cannot be used (deleted, moved, emptied),
    naming the folder and the catalog entry that points at it; None for a Hub phase, a family not
    built yet, or a folder that holds its config.json."""
    if not phase.built or phase.hub is not None or phase.path is None or (phase.path / "config.json").is_file():
        return None
    what = "holds no config.json" if phase.path.exists() else "is missing"
    name = f"{phase.family}@{phase.phase}"
    if phase.origin == "registered":
        return (f"{phase.ref}: the registered folder {phase.path} of catalog entry {name} ({registrations_file()}) "
                f"{what} (moved or deleted?); forge catalog remove {name}, then add it where it is now")
    fam = families()[phase.family]
    manifest = fam.home / "foundation.json" if fam.home is not None else "its foundation.json"
    return (f"{phase.ref}: the folder {phase.path} of the built family {phase.family} ({manifest}) {what}; "
            f"rebuild it with forge run {fam.build_recipe or 'its recipe'}")
