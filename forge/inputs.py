"""The one adapter from a recipe to what stages consume: data sources (read, fingerprinted, cleaned
by hygiene, augmented), and the base checkpoint (a folder, or a tiny model built from a config)."""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from forge import catalog
from forge.data.augment import augment_source
from forge.data.cloze import cloze_source
from forge.data.hygiene import Hygiene
from forge.data.objstore import is_remote, mirror
from forge.data.parallel import use_engine
from forge.data.prepare import clean_sources
from forge.data.rewrite import Clean, write_rewrites
from forge.data.sources import DATA_SUFFIXES, Source, find_files, is_saved_dataset
from forge.errors import ForgeError
from forge.gen.generate import write_generated
from forge.progress import phase
from forge.recipe import DataSource, Recipe
from forge.recipe.data import Rewrite
from forge.rundir import RunLayout
from forge.scratch import build_scratch_base, scratch_key


def resolve_source(name: str, cfg: DataSource, generated_dir: Path) -> Source:
    """A recipe data source as a readable Source (writing generated text first if asked); a source
    of chat records carries its FormatSpec (SFT and preference stages read it)."""
    src = _resolve_files(name, cfg, generated_dir)
    return src if cfg.chat is None else replace(src, chat=cfg.chat)


def _resolve_files(name: str, cfg: DataSource, generated_dir: Path) -> Source:
    if cfg.cloze is not None:
        raise ForgeError(f"data.{name}: its questions are made from data.{cfg.cloze} when a recipe's data is "
                         "prepared (forge run RECIPE, forge eval RECIPE); it cannot be read on its own")
    fields = (cfg.text_field,) if isinstance(cfg.text_field, str) else tuple(cfg.text_field)
    common = {"on_error": cfg.on_error, "max_errors": cfg.max_errors, "holdout": cfg.holdout,
              "max_records": cfg.max_records, "max_tokens": cfg.max_tokens}
    if cfg.source is not None:
        return _curated(name, cfg, fields, common)
    if cfg.hub is not None:
        return Source(name, (), "hub", fields, cfg.split, cfg.proprietary, hub=cfg.hub, hub_split=cfg.hub_split,
                      hub_revision=cfg.revision, **common)
    if cfg.generate is not None:
        g = cfg.generate
        path = write_generated(g.kind, g.documents, g.seed, generated_dir / f"{name}-{g.kind}-{g.documents}-seed{g.seed}.jsonl")
        return Source(name, (path,), "jsonl", ("text",), cfg.split, cfg.proprietary, **common)
    if is_remote(cfg.path):  # an object store: copied once into a local mirror keyed by ETag
        files = mirror(cfg.path, generated_dir / "remote", DATA_SUFFIXES)
        if not files:
            raise ForgeError(f"data.{name}.path: no objects at {cfg.path!r}")
        return Source(name, files, cfg.format, fields, cfg.split, cfg.proprietary, **common)
    if is_saved_dataset(cfg.path):
        files = tuple(sorted(Path(cfg.path).rglob("*.arrow")))
        return Source(name, files, "arrow", fields, cfg.split, cfg.proprietary, saved_dataset=Path(cfg.path), **common)
    files = find_files(cfg.path)
    if not files:
        raise ForgeError(f"data.{name}.path: no readable files at {cfg.path!r}")
    return Source(name, files, cfg.format, fields, cfg.split, cfg.proprietary, **common)


def _curated(name: str, cfg: DataSource, fields: tuple[str, ...], common: dict) -> Source:
    """A curated set (its text field, chat format and holdout are already on `cfg`, from the
    catalog): a built family's local file, or a hub dataset streamed at its pinned revision."""
    found = catalog.curated(cfg.source or "")
    if found.hub is not None:
        return Source(name, (), "hub", fields, cfg.split, cfg.proprietary, hub=found.hub, hub_split=found.split,
                      hub_revision=cfg.revision or found.revision, hub_data_files=found.data_files,
                      split_key=found.name, **common)
    if found.path is None or not found.path.is_file():
        why = catalog.build_note(found.ref) if catalog.unbuilt(found.ref) else f"{found.path} is missing"
        raise ForgeError(f"data.{name}.source: {found.ref}: {why}")
    return Source(name, (found.path,), cfg.format, fields, cfg.split, cfg.proprietary, split_key=found.name, **common)


@dataclass
class Inputs:
    raw: dict[str, Source]          # the sources as the recipe names them
    fingerprints: dict[str, str]    # content hash of each raw source
    sources: dict[str, Source]      # what stages read: hygiene's cleaned cache where it applies
    hygiene: dict[str, int]         # hygiene counts (never the values found)
    base: Path                      # the first stage's input checkpoint
    catalog: dict | None = None     # a catalog base: family, phase, point, location, revision (lineage)
    augmented: dict[str, dict[str, Any]] = field(default_factory=dict)  # model-written: generator and counts


def prepare_inputs(recipe: Recipe, out: Path) -> Inputs:
    """Read and clean the recipe's data under `out/data` and make the base (rank 0 writes; call it
    inside `main_process_first()` when several processes run)."""
    layout = RunLayout(out)
    with phase(f"data: reading {len(recipe.data)} source(s) ({', '.join(recipe.data)}) and fingerprinting them"):
        raw = {name: resolve_source(name, cfg, layout.data) for name, cfg in recipe.data.items() if cfg.cloze is None}
        fingerprints = {name: src.fingerprint() for name, src in raw.items()}
    evals = set(recipe.hygiene.decontaminate_against)
    todo = [n for n, cfg in recipe.data.items() if cfg.cleaned and n not in evals and n in raw]
    use_engine(recipe.prepare)  # the token caches' engine too (prepare.engine)
    sources, hygiene = clean_sources(recipe.hygiene, raw, todo, fingerprints, layout.data, recipe.prepare)
    cleaned: dict[str, str] = {}  # fingerprints of cleaned sources, read once: each hashes every byte

    def cleaned_fingerprint(name: str) -> str:
        if name not in cleaned:
            cleaned[name] = sources[name].fingerprint()
        return cleaned[name]

    for name, cfg in recipe.data.items():  # from the origin's cleaned documents, before their renderings
        if cfg.cloze is not None:
            with phase(f"data: writing fill-in-the-blank questions of the documents of {cfg.cloze} as {name}"):
                origin = sources[cfg.cloze]
                proprietary = cfg.proprietary if "proprietary" in cfg.model_fields_set else origin.proprietary
                raw[name] = sources[name] = cloze_source(name, origin, cleaned_fingerprint(cfg.cloze), layout.data,
                                                         cfg.holdout, proprietary)
                fingerprints[name] = raw[name].fingerprint()
    augmented: dict[str, dict[str, Any]] = {}
    for name, cfg in recipe.data.items():
        a = cfg.augment  # after hygiene: dedup never sees the copies
        if a is None or (a.renderings == 1 and a.rewrite is None):
            continue
        fingerprint, extra = cleaned_fingerprint(name), None
        if a.rewrite is not None:
            extra, augmented[name] = _rewrite(name, a.rewrite, sources[name], fingerprint, recipe, raw, layout.data)
        with phase(f"data: writing {a.renderings} rendering(s) of each document of {name}"
                   + (" and the model-written texts" if extra is not None else "")):
            sources[name] = augment_source(sources[name], a.renderings, a.seed, fingerprint, layout.data, extra)
    # what stages read is encoded once, by the workers, into token caches beside the data
    sources = {n: replace(s, token_dir=layout.data, workers=recipe.prepare.processes) for n, s in sources.items()}
    found = None
    if catalog.is_ref(recipe.base):
        found = catalog.resolve(recipe.base).record()
        base = catalog.checkpoint(recipe.base, log=print)
    elif isinstance(recipe.base, str):
        base = Path(recipe.base)
    else:
        scratch = recipe.base.scratch
        key = scratch_key(scratch, [fingerprints[n] for n in scratch.tokenizer_sources])
        base = build_scratch_base(scratch, [sources[n] for n in scratch.tokenizer_sources], layout.scratch_base(key))
    return Inputs(raw, fingerprints, sources, hygiene, base, found, augmented)


def _rewrite(name: str, settings: Rewrite, src: Source, fingerprint: str, recipe: Recipe,
             raw: dict[str, Source], out_dir: Path) -> tuple[Path, dict[str, Any]]:
    """Model-written paraphrases and QA of `src`'s training documents (forge.data.rewrite, asked of
    forge.lm.rewrite's generator only when not cached), and what the lineage records of them: the
    generator (never a credential) and the counts kept and dropped."""
    from forge.lm.rewrite import identity, open_writer

    where = f"data.{name}.augment.rewrite.model"
    generator = identity(settings, where)
    keyed = settings.model_dump(include={"paraphrases", "questions", "seed", "max_new_tokens"})
    keyed["hygiene"] = repr(recipe.hygiene)  # what cleans the output is part of what is written
    with phase(f"data: model-written paraphrases and questions of {name} by {settings.model}"):
        path, counts = write_rewrites(src, lambda: open_writer(settings, where), keyed, generator,
                                      fingerprint, _output_hygiene(name, recipe, raw), out_dir)
    return path, {"generator": settings.model, "identity": generator, "file": str(path), **counts.as_dict()}


def _output_hygiene(name: str, recipe: Recipe, raw: dict[str, Source]) -> Clean:
    """The recipe's hygiene for model-written text, whatever the source's own setting (a generator
    can write personal data or secrets that were never in the documents): PII and secrets as the
    recipe says, decontamination against its evaluation sets, exact duplicates among the outputs."""
    cfg = replace(recipe.hygiene, dedup="exact")
    evals = (t for n in recipe.hygiene.decontaminate_against for _, t in raw[n].records())

    def clean(records: Any) -> Any:
        return Hygiene(cfg, evals).process(f"{name}.rewrite", records)

    return clean


def input_fingerprints(recipe: Recipe, inputs: Inputs) -> dict[str, str]:
    """{'data.<name>': sha256, 'base': sha256} for a run folder's record (a scratch base is fixed
    by the recipe and its data, so it needs none of its own)."""
    from forge.rundir import base_fingerprint

    out = {f"data.{name}": fp for name, fp in inputs.fingerprints.items()}
    if isinstance(recipe.base, str):
        out["base"] = base_fingerprint(inputs.base)
    return out
