"""The forge-tiny foundation family: a model built from nothing through the four phases Nova names
(constant-LR pretraining, LR ramp-down on higher-quality text, context extension, alignment: SFT
then a short preference stage), each phase's checkpoint published with the curated sets that made it.

The stages are an ordinary recipe run by the Novella pipeline (pipelines/novella.py: the same
runner, lineage and MLflow runs); this pipeline checks the recipe's curated sets, then publishes
the phase checkpoints, the sets and `foundation.json` (the catalog reads it, forge.catalog).

    forge run recipes/foundation-tiny.yaml        # the family in the run's output/foundation, and (the
                                                  # recipe as it is) installed in FORGE_HOME/foundations
    build(FORGE_HOME/foundations/forge-tiny, log) # what `catalog://forge-tiny@PHASE` builds on first use
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterator

from forge.errors import ForgeError
from forge.gen import harvest
from forge.gen.curated import HOLDOUT, SETS
from forge.pipeline import PipelineContext
from forge.recipe import Recipe, resolved_yaml
from forge.rundir import RESOLVED, RunLayout
from forge.train.accel import process_state

FAMILY = "forge-tiny"
RECIPE = Path(__file__).resolve().parents[1] / "recipes" / "foundation-tiny.yaml"
# phase -> the recipe stage whose output it is (each phase's point is families.yaml's: point())
PHASES = {"pretrained": "constant-lr", "ramped-down": "ramp-down", "mid-trained": "context-extension",
          "post-trained": "preference"}
PURPOSE = {"general": "pretraining", "highquality": "pretraining", "long": "mid-training", "skills": "mid-training",
           "instructions": "sft", "preferences": "preference"}
MEASURE_PER_TASK = 40  # held-out instruction prompts per task scored for measured.json
SKIP = {"training_state.pt", "forge_state.json", "manifest.json", "lineage.json", "MODEL_CARD.md"}  # not the model's


def run(ctx: PipelineContext) -> Any:
    """Run the recipe's stages (the Novella pipeline), then publish the family under
    `output/foundation`; the family's own recipe, unchanged but for its output folder, also
    installs it as the catalog's forge-tiny (FORGE_HOME/foundations/forge-tiny). Returns the
    Novella pipeline's result."""
    recipe, log = ctx.recipe, ctx.log
    result = _run(ctx)
    home = catalog_home()
    if _is_family_recipe(recipe) and process_state().is_main_process:
        home.parent.mkdir(parents=True, exist_ok=True)
        with _lock(home.parent / f".{home.name}.lock", log):
            staging = home.with_name(f".{home.name}.staging-{os.getpid()}")
            shutil.rmtree(staging, ignore_errors=True)
            shutil.copytree(RunLayout(Path(recipe.output)).foundation, staging)
            _swap_in(staging, home)
        log(f"foundation: installed as the catalog's {FAMILY}: {home}")
    return result


def _run(ctx: PipelineContext) -> Any:
    from pipelines import novella

    recipe, log = ctx.recipe, ctx.log
    check_recipe(recipe)
    start = time.monotonic()
    result = novella.run(ctx)
    if process_state().is_main_process:
        out = RunLayout(Path(recipe.output)).foundation
        publish(recipe, {s.name: r.checkpoint for s, r in zip(recipe.stages, result.stages)}, out)
        log(f"foundation: {FAMILY} published at {out} ({time.monotonic() - start:.0f} s); what each phase knows:")
        from pipelines.foundation_measure import measure

        figures = measure(out, MEASURE_PER_TASK, log=log)
        (out / "measured.json").write_text(json.dumps(figures, indent=1) + "\n")
    return result


def point(phase: str) -> str:
    """The phase's point as forge/catalog/families.yaml declares it, the one place it is said."""
    from forge.catalog.entries import declared_points

    return declared_points(FAMILY)[phase]


def catalog_home() -> Path:
    """Where the catalog looks for the built family: FORGE_HOME/foundations/forge-tiny."""
    from forge.catalog import forge_home

    return forge_home() / "foundations" / FAMILY


def _is_family_recipe(recipe: Recipe) -> bool:
    """Whether `recipe` is recipes/foundation-tiny.yaml as it is (only its output folder may differ)."""
    from forge.recipe import load_recipe

    own = load_recipe(RECIPE, [f"output={recipe.output}"])
    return own.model_dump(mode="json") == recipe.model_dump(mode="json")


def check_recipe(recipe: Recipe) -> None:
    """The curated sets are named after their kind with the sets' holdout (their held-out records
    line up across sets only so: forge.gen.curated), and every phase's stage is in the recipe."""
    for name, cfg in recipe.data.items():
        kind = cfg.generate.kind if cfg.generate is not None else ""
        if not kind.startswith("harvest_"):
            continue
        if name != kind.removeprefix("harvest_"):
            raise ForgeError(f"{recipe.name}: data.{name}.generate.kind: {kind} must be the source named "
                             f"{kind.removeprefix('harvest_')!r} (the held-out split is keyed by that name)")
        if abs(cfg.holdout - HOLDOUT) > 1e-12:
            raise ForgeError(f"{recipe.name}: data.{name}.holdout: the curated sets hold out {HOLDOUT}, got {cfg.holdout}")
    names = [s.name for s in recipe.stages]
    missing = [stage for stage in PHASES.values() if stage not in names]
    if missing:
        raise ForgeError(f"{recipe.name}: stages: the foundation needs stages named {missing} (its phases "
                         f"{list(PHASES)}); it has {names}")


def publish(recipe: Recipe, outputs: dict[str, Path], out: Path) -> Path:
    """Write the family into `out` (replacing it): each phase's checkpoint folder, the curated sets,
    the resolved recipe, and foundation.json last."""
    staging = out.with_name(f".{out.name}.staging-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    trained: list[str] = []
    phases = {}
    for stage in recipe.stages:
        trained += [n for n in stage.sources if n not in trained]
        for phase, name in PHASES.items():
            if name == stage.name:
                _copy_checkpoint(outputs[name], staging / phase)
                phases[phase] = {"path": phase, "point": point(phase), "curated": list(trained)}
    curated = {}
    for name in [n for n in SETS if n in recipe.data] + [n for n in recipe.data if n not in SETS]:
        cfg = recipe.data[name]
        src = _source_file(recipe, name)
        (staging / "curated").mkdir(exist_ok=True)
        shutil.copyfile(src, staging / "curated" / f"{name}.jsonl")
        curated[name] = {"purpose": PURPOSE.get(name, "pretraining"), "path": f"curated/{name}.jsonl",
                         "holdout": cfg.holdout, "format": "jsonl",
                         "text_field": None if cfg.chat is not None else "text", "chat": _chat(cfg.chat)}
    (staging / RESOLVED).write_text(resolved_yaml(recipe))  # the run folder's name for it, in the family too
    manifest = {"family": FAMILY, "phases": phases, "curated": curated, "recipe": RESOLVED,
                "built": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                "corpus": corpus_record({n: staging / c["path"] for n, c in curated.items()}),
                "harvest": harvest.fingerprint()}  # the standard library files it read
    (staging / "foundation.json").write_text(json.dumps(manifest, indent=2) + "\n")
    _swap_in(staging, out)
    return out


def corpus_record(files: dict[str, Path]) -> dict[str, Any]:
    """The corpus the phases were trained on, by content: each curated set's sha256 and one sha256
    over them (`name<TAB>sha256` lines in name order): the figure `forge catalog show` prints."""
    sets = {}
    for name in sorted(files):
        with open(files[name], "rb") as f:
            sets[name] = hashlib.file_digest(f, "sha256").hexdigest()
    total = hashlib.sha256("".join(f"{n}\t{h}\n" for n, h in sets.items()).encode()).hexdigest()
    return {"sha256": total, "sets": sets}


def _chat(spec: Any) -> dict | None:
    """A FormatSpec as a recipe's `chat:` block would give it: its kind and what differs from the defaults."""
    if spec is None:
        return None
    from dataclasses import asdict

    from forge.data.formats import FormatSpec

    given, default = asdict(spec), asdict(FormatSpec(kind=spec.kind))
    return {k: v for k, v in given.items() if k == "kind" or v != default[k]}


def _source_file(recipe: Recipe, name: str) -> Path:
    """The one JSONL file the run read for data source `name` (forge.inputs resolves it again: a
    generated set is found where the run wrote it)."""
    from forge.inputs import resolve_source

    files = resolve_source(name, recipe.data[name], RunLayout(Path(recipe.output)).data).files
    if len(files) != 1 or not files[0].name.endswith(".jsonl"):
        raise ForgeError(f"{recipe.name}: data.{name}: the foundation publishes one JSONL file per set, "
                         f"the source has {[f.name for f in files][:4]}")
    return files[0]


def _copy_checkpoint(src: Path, dst: Path) -> None:
    """The Hugging Face files of a stage's checkpoint (weights, config, tokenizer, chat template)."""
    dst.mkdir(parents=True)
    for f in sorted(Path(src).iterdir()):
        if f.is_file() and f.name not in SKIP:
            shutil.copyfile(f, dst / f.name)


def _swap_in(staging: Path, out: Path) -> None:
    """`staging` takes `out`'s place (renames: a reader sees the old family or the new one)."""
    if out.exists():
        old = out.with_name(f".{out.name}.old-{os.getpid()}")
        os.replace(out, old)
        os.replace(staging, out)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(staging, out)


# ------------------------------------------------------------------------------ build on first use
def build(home: Path, log: Callable[[str], None] = print, overrides: list[str] | None = None) -> None:
    """Build the family into `home` (FORGE_HOME/foundations/forge-tiny) from recipes/foundation-tiny.yaml:
    in a work folder beside it, under a lock (a second process waits, then finds it built); `home`
    appears whole, foundation.json written last. Does nothing if `home` already holds a family."""
    home = Path(home).resolve()
    home.parent.mkdir(parents=True, exist_ok=True)
    with _lock(home.parent / f".{home.name}.lock", log):
        if (home / "foundation.json").is_file():
            return
        from forge.recipe import load_recipe
        from forge.track import MlflowTracker

        work = home.parent / f".{home.name}.build"
        shutil.rmtree(work, ignore_errors=True)
        recipe = load_recipe(RECIPE, [f"output={work}", *(overrides or [])])
        start = time.monotonic()
        log(opening(home))
        # the work folder goes once the family is in place, so nothing is logged to MLflow
        tracker = MlflowTracker(recipe.tracking_uri, recipe.experiment, enabled=False)
        from forge.plan.recipe_plan import plan_recipe

        _run(PipelineContext(recipe, tracker, {p.stage: p for p in plan_recipe(recipe)}, log=log))
        _swap_in(_take(RunLayout(work).foundation, home), home)
        shutil.rmtree(work, ignore_errors=True)
        log(f"foundation: {FAMILY} built in {time.monotonic() - start:.0f} s: {home}")


def _take(folder: Path, home: Path) -> Path:
    staging = home.with_name(f".{home.name}.staging-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    os.replace(folder, staging)
    return staging


def opening(home: Path) -> str:
    """The build's first line: what it builds, where, and how long it took when it was measured."""
    return f"foundation: building {FAMILY} into {home} (recipe {RECIPE.name}, {_measured()})"


def _measured() -> str:
    """The headline of the recipe's own note of its measured build time (its second line, up to the
    per-stage figures that follow the second colon), e.g. "measured: 9.6 min (578 s) on 2 cores, idle"."""
    lines = RECIPE.read_text().splitlines()[1:2] if RECIPE.is_file() else []
    headline = ": ".join(lines[0].lstrip("# ").split(": ")[:2]).strip() if lines else ""
    return headline or "up to 15 minutes on 2 CPU cores"


@contextlib.contextmanager
def _lock(path: Path, log: Callable[[str], None]) -> Iterator[None]:
    """An exclusive lock on `path` (fcntl): a second builder waits for the first."""
    import fcntl

    with open(path, "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log(f"foundation: another process is building {FAMILY}; waiting for it ({path})")
            fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
