"""The Recipe model, its loading (YAML, overrides, paths relative to the file) and the cross-field
validators (data sources a stage reads, context lengths, LoRA targets, soup ingredients).

A recipe is YAML validated once, at load time, into typed pydantic models. Every problem is
reported on its own line naming the dotted path (``stages[1].optim.lr``), the YAML line, what was
given and what was expected; stage code then reads typed fields and never guesses defaults.
"""
from __future__ import annotations

import copy
import glob
import json
import os
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import Discriminator, Field, Tag, ValidationError, field_validator, model_validator

from forge.base_check import absent, check_base
from forge.data.hygiene import HygieneConfig
from forge.data.objstore import is_remote
from forge.data.parallel import PrepareConfig
from forge.errors import LOOP, ForgeError, symlink_loop
from forge.recipe.data import (  # noqa: F401  (GeneratedText: re-exported with the schema)
    NAME,
    DataSource,
    GeneratedText,
    Strict,
)
from forge.recipe.errors import apply_overrides, format_errors
from forge.recipe.yaml import read_recipe_yaml
from forge.rundir import RunLayout
from forge.scrub import scrub_tree

# -------------------------------------------------------------------------------------- stages
# in this order (isort off): settings' stage kinds register, then rft's, then the registry that reads them
# isort: off
from forge.recipe.settings import (  # noqa: E402,F401  (re-exported with the schema)
    ContextExtension, DpoStage, MidtrainStage, NovaMixture, Optim, PostTrainSettings, PretrainStage, Schedule, SftStage,
    SoupStage, TrainSettings,
)
from forge.recipe.rft_settings import RftStage  # noqa: E402,F401  (registers the rft kind)
from forge.recipe.registry import AnyStage, StageSettings, stage_kinds  # noqa: E402,F401
from forge.recipe.eval import EvalBlock  # noqa: E402
from forge.recipe.judge import resolve_judge_paths  # noqa: E402
# isort: on

Stage = AnyStage  # stages[i]: the settings class registered under the item's kind (forge/recipe/registry.py)


# ---------------------------------------------------------------------------------------- base
class ScratchBase(Strict):
    """A tiny Llama-style model made from a config, with a BPE tokenizer trained on recipe data."""

    arch: Literal["llama"] = "llama"
    hidden_size: int = Field(64, ge=8, le=8192)
    layers: int = Field(2, ge=1, le=128)
    heads: int = Field(4, ge=1)
    kv_heads: int | None = Field(None, ge=1)
    intermediate_size: int | None = Field(None, ge=8)
    vocab_size: int = Field(1024, ge=64, le=262_144)
    max_position: int = Field(512, ge=16)
    tokenizer_sources: list[str] = Field(min_length=1)
    seed: int = 0

    @model_validator(mode="after")
    def _heads(self) -> ScratchBase:
        if self.hidden_size % self.heads:
            raise ValueError(f"hidden_size ({self.hidden_size}) must be divisible by heads ({self.heads})")
        if self.kv_heads and self.heads % self.kv_heads:
            raise ValueError(f"heads ({self.heads}) must be divisible by kv_heads ({self.kv_heads})")
        return self

    def hf_config(self) -> dict[str, Any]:
        """The transformers LlamaConfig this base builds (also what the planner reads)."""
        return {
            "model_type": "llama",
            "architectures": ["LlamaForCausalLM"],
            "hidden_size": self.hidden_size,
            "num_hidden_layers": self.layers,
            "num_attention_heads": self.heads,
            "num_key_value_heads": self.kv_heads or self.heads,
            "intermediate_size": self.intermediate_size or 4 * self.hidden_size,
            "vocab_size": self.vocab_size,
            "max_position_embeddings": self.max_position,
            "tie_word_embeddings": True,
            "rms_norm_eps": 1e-5,
            "hidden_act": "silu",
        }


class Base(Strict):
    scratch: ScratchBase


# ------------------------------------------------------------------------------------- recipe
class Tracking(Strict):
    uri: str | None = Field(None, description="MLflow tracking URI; default: SQLite inside the output folder")
    experiment: str | None = None
    register_model: bool = True
    alias: str = Field("champion", pattern=r"^[A-Za-z][A-Za-z0-9_-]*$",
                       description="deployment alias: moves to a version only if its gates pass and it beats the "
                                   "holder on eval.primary (every version gets 'candidate'; alias: candidate "
                                   "gives every run the alias, as before gates)")
    system_metrics: bool = Field(False, description="log CPU, memory and GPU use per stage (MLflow system metrics)")
    on_error: Literal["fail", "buffer"] = Field("fail", description="the store failing mid-run: fail the run, or "
                                                "keep training, buffer the records and retry")

    @field_validator("alias")
    @classmethod
    def _not_reserved(cls, v: str) -> str:
        if v.lower() == "latest":
            raise ValueError("'latest' is reserved by the MLflow registry; choose another alias, e.g. candidate")
        return v


class Parallelism(Strict):
    """How the training processes of a launch share the work (forge.train.parallel implements each)."""

    strategy: Literal["ddp", "fsdp"] = Field("ddp", description="ddp: every process holds the whole model and "
                                             "a share of each batch (one process: plain training); fsdp: "
                                             "FSDP2, parameters, gradients and optimizer state sharded")
    sharding: Literal["full", "hybrid"] = Field("full", description="fsdp: full (one shard group over every "
                                                "process) or hybrid (sharded within a node, replicated across)")
    mixed_precision: Literal["none", "bf16"] = Field("none", description="fsdp: bf16 parameters in compute, "
                                                     "fp32 master weights and gradient reduction")
    activation_checkpointing: bool = Field(False, description="recompute each decoder layer's activations "
                                           "in the backward pass (less memory, ~1/3 more compute)")
    cpu_offload: bool = Field(False, description="fsdp: keep parameter shards, gradients and optimizer "
                              "state in CPU memory")

    @model_validator(mode="after")
    def _fsdp_only(self) -> Parallelism:
        if self.strategy != "fsdp":
            given = [f"{k}: {getattr(self, k)}" for k in ("sharding", "mixed_precision", "cpu_offload")
                     if k in self.model_fields_set and getattr(self, k) != Parallelism.model_fields[k].default]
            if given:
                raise ValueError(f"{', '.join(given)} needs strategy: fsdp (strategy is {self.strategy})")
        return self


class Compute(Strict):
    target: str = "local"
    chips: int | None = Field(None, gt=0)
    stack: str | None = Field(None, description="training stack the planner models (fsdp, megatron, neuron, ...)")
    calibration: str | None = Field(None, description="a calibration file from `forge plan --calibrate` to apply")


# a registered model's name: a recipe's (its Novella registers under it), `forge serve`'s tracking.register
MODEL_NAME = r"^[A-Za-z][A-Za-z0-9_.-]*$"


class Recipe(Strict):
    name: str = Field(pattern=MODEL_NAME)
    pipeline: str = Field("novella", pattern=r"^[a-z_][a-z0-9_]*$")
    base: Annotated[Annotated[str, Tag("<path>")] | Annotated[Base, Tag("<scratch>")],
                    Discriminator(lambda v: "<path>" if isinstance(v, str) else "<scratch>")]
    data: dict[Annotated[str, Field(pattern=NAME)], DataSource] = Field(min_length=1)
    stages: list[AnyStage] = Field(min_length=1)
    hygiene: HygieneConfig = HygieneConfig()
    # how data preparation runs (workers, engine): top level, as `data:` maps names to sources
    prepare: PrepareConfig = PrepareConfig()
    tracking: Tracking = Tracking()
    compute: Compute = Compute()
    parallelism: Parallelism = Parallelism()
    eval: EvalBlock | None = Field(None, description="evaluation suite, gates and primary metric (forge.eval)")
    output: str

    @model_validator(mode="after")
    def _cross_refs(self) -> Recipe:
        problems = _data_problems(self)
        names = [s.name for s in self.stages]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            problems.append(f"stages: stage names must be unique, repeated: {dupes}")
        for i, stage in enumerate(self.stages):
            if isinstance(stage, SoupStage):
                for j, ing in enumerate(stage.ingredients):
                    if ing in names[i:]:
                        problems.append(f"stages[{i}].ingredients[{j}]: stage {ing!r} does not run before "
                                        f"{stage.name!r}; a soup takes earlier stages or checkpoint folders")
        if isinstance(self.base, Base):
            for src in self.base.scratch.tokenizer_sources:
                if src not in self.data:
                    problems.append(f"base.scratch.tokenizer_sources: unknown data source {src!r}")
            problems += context_problems(self.stages, self.base.scratch.max_position, "base.scratch.max_position")
            problems += lora_problems(self.stages, LLAMA_MODULES, "a scratch llama")
        for i, stage in enumerate(self.stages[:-1]):
            if isinstance(stage, PostTrainSettings) and stage.lora is not None and not stage.lora.merge:
                problems.append(f"stages[{i}].lora.merge: false saves only an adapter, which the next stage "
                                f"({self.stages[i + 1].name!r}) cannot start from; merge it or make it the last stage")
        if self.eval is not None:
            for src in self.eval.sources():
                if src not in self.data:
                    problems.append(f"eval: unknown data source {src!r}; known: {sorted(self.data)}")
            rewarded = [s for s in self.stages if "reward" in s.evaluates]
            if self.eval.reward is not None and not rewarded:  # its defaults come from an rft stage
                for key in ("source", "rewards"):
                    if getattr(self.eval.reward, key) is None:
                        problems.append(f"eval.reward.{key}: the recipe has no rft stage to take it from; give it")
        if problems:
            raise ValueError("\n".join(problems))
        return self

    @property
    def tracking_uri(self) -> str:
        return self.tracking.uri or f"sqlite:///{RunLayout(Path(self.output).resolve()).mlflow_db}"

    @property
    def experiment(self) -> str:
        return self.tracking.experiment or self.name


# ------------------------------------------------------------------------------------ loading
def _data_problems(recipe: Recipe) -> list[str]:
    """Every source a stage names exists, is not an evaluation set, and has the form the stage reads."""
    problems = []
    for j, src in enumerate(recipe.hygiene.decontaminate_against):
        if src not in recipe.data:
            problems.append(f"hygiene.decontaminate_against[{j}]: unknown data source {src!r}")
        elif recipe.data[src].cloze is not None:
            problems.append(f"hygiene.decontaminate_against[{j}]: data.{src} is made after hygiene (cloze:); "
                            "name an evaluation set read from files")
    for name, cfg in recipe.data.items():
        origin = recipe.data.get(cfg.cloze or "")
        if cfg.cloze is not None and (origin is None or origin.chat is not None or origin.cloze is not None):
            what = "an unknown source" if origin is None else "chat records, not documents"
            problems.append(f"data.{name}.cloze: {cfg.cloze!r} is {what}; name a source of plain-text documents, "
                            f"one of {sorted(n for n, c in recipe.data.items() if c.chat is None)}")
    for i, stage in enumerate(recipe.stages):
        problems += _source_problems(recipe, i, stage)
    return problems


LLAMA_MODULES = frozenset({"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
                           "embed_tokens", "lm_head"})
PREFERENCE_FORMATS = ("preference", "hh")  # the chat formats (chat.kind) that hold preference pairs


def lora_problems(stages: list, modules: frozenset, what: str) -> list[str]:
    """LoRA target modules that the base architecture lacks (checked where the architecture is known)."""
    problems = []
    for i, stage in enumerate(stages):
        if isinstance(stage, PostTrainSettings) and stage.lora is not None:
            for j, m in enumerate(stage.lora.target_modules):
                if m not in modules:
                    problems.append(f"stages[{i}].lora.target_modules[{j}]: {m!r} is not a module of {what}; "
                                    f"it has {sorted(modules)}")
    return problems


def _source_problems(recipe: Recipe, i: int, stage: StageSettings) -> list[str]:
    """A stage's sources exist, are no evaluation set, and hold what its kind reads (`reads` on
    its settings class): plain text, chat records, preference pairs, or prompt rows (any record)."""
    problems, evals = [], set(recipe.hygiene.decontaminate_against)
    for src, path in stage.source_paths().items():
        at, cfg = f"stages[{i}].{path}", recipe.data.get(src)
        named = "" if path.endswith(src) else f" {src!r}"  # a mixture path already names the source
        if cfg is None:
            problems.append(f"{at}: unknown data source{named}; known: {sorted(recipe.data)}")
        elif src in evals:
            problems.append(f"{at}:{named} is an evaluation set (hygiene.decontaminate_against); "
                            "a stage must not train on it")
        elif stage.reads == "prompts":
            continue  # prompt rows are read directly (e.g. rft: prompt_field and the reward functions' fields)
        elif stage.reads == "text":
            if cfg.chat is not None and cfg.source is None:  # a curated chat set replays as text
                problems.append(f"{at}: data.{src} holds chat records (chat: ...), "
                                f"which a {stage.kind} stage does not read; give it plain text")
        elif cfg.chat is None and getattr(stage, "replays_text", False) and _has_chat(recipe, stage):
            continue  # plain text beside chat records: replayed as language modelling (forge.stages.replay)
        elif cfg.chat is None:
            problems.append(f"{at}: data.{src} holds plain text, which a {stage.kind} stage cannot read; give "
                            f"data.{src} a chat: mapping (kind: messages | instruction | prompt_completion | "
                            "preference | hh)")
        elif stage.reads == "preference" and cfg.chat.kind not in PREFERENCE_FORMATS:
            problems.append(f"{at}: data.{src} has chat.kind {cfg.chat.kind!r}, which holds no preference pairs; "
                            f"a {stage.kind} stage needs chat.kind {' or '.join(PREFERENCE_FORMATS)}")
        elif cfg.cleaned:
            problems.append(f"{at}: data.{src} has hygiene on, which rewrites records as plain text; chat records "
                            f"are not cleaned yet: set data.{src}.hygiene: false")
    return problems


def _has_chat(recipe: Recipe, stage: StageSettings) -> bool:
    return any(recipe.data[n].chat is not None for n in stage.sources if n in recipe.data)


def context_problems(stages: list, context: int | None, origin: str) -> list[str]:
    """Each stage's seq_len fits the context the model has when the stage starts; a midtrain stage
    with a `context:` block extends it (and the stages after it then have the longer context)."""
    problems = []
    for i, stage in enumerate(stages):
        if isinstance(stage, MidtrainStage) and stage.context is not None:
            context, origin = stage.context_length(), f"stages[{i}].context"
            if stage.seq_len > context:
                problems.append(f"stages[{i}].seq_len: {stage.seq_len} exceeds context.max_position ({context})")
        elif isinstance(stage, TrainSettings) and context and stage.seq_len > context:
            problems.append(f"stages[{i}].seq_len: {stage.seq_len} exceeds the model's context ({context}, "
                            f"from {origin}); extend it in a midtrain stage with a context: block "
                            "(rope_theta and/or rope_scaling)")
    return problems


def _check_files(recipe: Recipe, lines: dict, where: str) -> list[str]:
    problems = []

    def at(path: tuple) -> str:
        return f"{where}:line {lines[path]}" if path in lines else where

    if isinstance(recipe.base, str) and not recipe.base.startswith("catalog://"):
        base = Path(recipe.base)
        if symlink_loop(base):
            problems.append(f"{at(('base',))}: base: {recipe.base!r}: {LOOP}")
        elif not base.exists():
            problems.append(f"{at(('base',))}: base: {recipe.base!r} {absent(base)}")
        elif not (base / "config.json").is_file():
            problems.append(
                f"{at(('base',))}: base: {recipe.base!r} is not a Hugging Face checkpoint folder "
                "(expected a directory holding config.json)"
            )
        else:
            context = _config_context(base / "config.json")
            problems += [f"{where}: {p}" for p in context_problems(recipe.stages, context, f"{base}/config.json")]
            problems += [f"{at(('base',))}: base: {p}" for p in check_base(base)]  # forge/base_check.py
    elif isinstance(recipe.base, str):
        problems += _catalog_problems(recipe, at(("base",)), where)
    if symlink_loop(recipe.output):
        problems.append(f"{at(('output',))}: output: {recipe.output!r}: {LOOP}")
    stage_names = {s.name for s in recipe.stages}
    for i, stage in enumerate(recipe.stages):
        for j, ing in enumerate(stage.ingredients if isinstance(stage, SoupStage) else []):
            if ing not in stage_names and not (Path(ing) / "config.json").is_file():
                problems.append(f"{at(('stages', i, 'ingredients', j))}: stages[{i}].ingredients[{j}]: {ing!r} is "
                                "neither an earlier stage nor a checkpoint folder holding config.json")
    for name, src in recipe.data.items():
        if src.path is None or is_remote(src.path):  # an object store is listed when the data is read
            continue
        if symlink_loop(src.path):  # glob would list it, and reading it would fail later
            problems.append(f"{at(('data', name, 'path'))}: data.{name}.path: {src.path!r}: {LOOP}")
        elif not (Path(src.path).exists() or glob.glob(src.path)):
            why = absent(src.path) if not glob.has_magic(src.path) else "matches no file or folder"
            problems.append(f"{at(('data', name, 'path'))}: data.{name}.path: {src.path!r} {why}")
    return problems


def _catalog_problems(recipe: Recipe, at: str, where: str) -> list[str]:
    """A `catalog://FAMILY@PHASE` base: the phase exists, its folder (when on disk) is a sound
    checkpoint, and each stage fits the phase's context (its config.json's when downloaded)."""
    from forge import catalog

    try:
        phase = catalog.resolve(recipe.base)
    except ForgeError as e:
        return [f"{at}: {e}"]
    gone = catalog.missing(phase)  # a registered folder deleted since: say so, not "ok"
    if gone:
        return [f"{at}: base: {gone}"]
    folder = catalog.cached(phase)
    context = _config_context(folder / "config.json") if folder is not None else phase.context
    problems = [f"{where}: {p}" for p in context_problems(recipe.stages, context, phase.ref)]
    if folder is not None:
        problems += [f"{at}: base: {p}" for p in check_base(folder)]
    return problems


def _config_context(config: Path) -> int | None:
    try:
        value = json.loads(config.read_text()).get("max_position_embeddings")
    except (OSError, ValueError, AttributeError):
        return None  # an unreadable config is reported where the model is loaded
    return value if isinstance(value, int) else None


def resolve_paths(raw: dict, root: Path) -> dict:
    """Paths in a recipe are relative to the recipe file (so recipes run from any directory)."""

    def fix(p: str) -> str:
        if "\0" in p:  # no file system takes one; the OS call would raise a bare ValueError
            raise ForgeError(f"{root}: a path in the recipe holds a NUL byte (\\0): {p!r}")
        if "://" in p or os.path.isabs(p):
            return p
        if p.startswith("~"):
            return os.path.expanduser(p)
        try:
            return str((root / p).resolve())
        except (RuntimeError, OSError):  # a symbolic link loop on the way (Python 3.11: RuntimeError)
            return str(root / p)  # kept as written: the file checks name the loop with its field

    out = copy.deepcopy(raw)
    if isinstance(out.get("base"), str):
        out["base"] = fix(out["base"])
    if isinstance(out.get("output"), str):
        out["output"] = fix(out["output"])
    if isinstance(out.get("compute"), dict) and isinstance(out["compute"].get("calibration"), str):
        out["compute"]["calibration"] = fix(out["compute"]["calibration"])
    for stage in out.get("stages") or [] if isinstance(out.get("stages"), list) else []:
        ings = stage.get("ingredients") if isinstance(stage, dict) else None
        for rw in (stage.get("rewards") or []) if isinstance(stage, dict) and isinstance(stage.get("rewards"), list) else []:
            if isinstance(rw, dict) and isinstance(rw.get("source"), str) and ".py:" in rw["source"]:
                file, _, fn = rw["source"].rpartition(":")  # a reward file is relative to the recipe too
                rw["source"] = f"{fix(file)}:{fn}"
        if isinstance(stage, dict) and isinstance(stage.get("env"), str) and ".py:" in stage["env"]:
            file, _, cls = stage["env"].rpartition(":")  # an rft environment file, relative to the recipe
            stage["env"] = f"{fix(file)}:{cls}"
        if isinstance(ings, list):  # a soup ingredient with a '/' is a folder (stage names have none)
            stage["ingredients"] = [fix(x) if isinstance(x, str) and "/" in x else x for x in ings]
    ev = out.get("eval") if isinstance(out.get("eval"), dict) else {}
    if isinstance(ev.get("custom"), list):  # 'file.py:function': the file relative to the recipe
        ev["custom"] = [fix(x) if isinstance(x, str) and ":" in x else x for x in ev["custom"]]
    rw = ev.get("reward") if isinstance(ev.get("reward"), dict) else {}
    for r in rw.get("rewards") if isinstance(rw.get("rewards"), list) else []:
        if isinstance(r, dict) and isinstance(r.get("source"), str) and ".py:" in r["source"]:
            file, _, fn = r["source"].rpartition(":")  # as a stage's reward file: relative to the recipe
            r["source"] = f"{fix(file)}:{fn}"
    resolve_judge_paths(ev, out.get("stages") if isinstance(out.get("stages"), list) else [], fix)
    lm = ev.get("lm_eval") if isinstance(ev.get("lm_eval"), dict) else {}
    if isinstance(lm.get("tasks"), list):  # task YAML files, relative to the recipe
        lm["tasks"] = [fix(x) if isinstance(x, str) and x.endswith((".yaml", ".yml")) else x for x in lm["tasks"]]
    for src in (out.get("data") or {}).values() if isinstance(out.get("data"), dict) else []:
        if isinstance(src, dict) and isinstance(src.get("path"), str):
            src["path"] = fix(src["path"])
    return out


def load_recipe(path: str | os.PathLike, overrides: list[str] | None = None) -> Recipe:
    """Load, override and validate a recipe; raise ForgeError listing every problem found."""
    path = Path(path)
    where = str(path)
    if symlink_loop(path):
        raise ForgeError(f"{where}: the recipe file is {LOOP}")
    if not path.is_file():
        raise ForgeError(f"{where}: recipe file not found")
    raw, lines = read_recipe_yaml(path)  # UTF-8, duplicate keys, alias bombs and nesting checked there
    if not isinstance(raw, dict):
        raise ForgeError(f"{where}: a recipe must be a YAML mapping (name, base, data, stages, output)")
    raw, origins = apply_overrides(raw, overrides or [])
    raw = resolve_paths(raw, path.parent.resolve())
    try:
        recipe = Recipe.model_validate(raw)
    except ValidationError as e:
        raise ForgeError("\n".join(format_errors(e, Recipe, where, lines, origins))) from None
    problems = _check_files(recipe, lines, where)
    if problems:
        raise ForgeError("\n".join(problems))
    return recipe


def resolved_yaml(recipe: Recipe) -> str:
    """The recipe as it will run (defaults filled, overrides applied, paths absolute), scrubbed by
    forge.scrub (URL passwords masked, secrets and personal data replaced by placeholders)."""
    return yaml.safe_dump(scrub_tree(recipe.model_dump(mode="json")), sort_keys=False)
