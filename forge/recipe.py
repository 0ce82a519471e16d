"""Recipe schema, loading and dotted command-line overrides.

A recipe is YAML validated once, at load time, into typed pydantic models. Every problem is
reported on its own line naming the dotted path (``stages[1].optim.lr``), the YAML line, what was
given and what was expected; stage code then reads typed fields and never guesses defaults.
"""
from __future__ import annotations

import copy
import glob
import os
from pathlib import Path
from typing import Annotated, Any, Literal, Union

import yaml
from pydantic import ConfigDict, Discriminator, Field, Tag, ValidationError, field_validator, model_validator

from forge.base_check import check_base
from forge.errors import ForgeError
from forge.recipe_data import (  # noqa: F401  (ChatFormat, GeneratedText: re-exported with the schema)
    NAME, ChatFormat, DataSource, GeneratedText, HygieneSettings, Strict,
)
from forge.recipe_errors import apply_overrides, format_errors
from forge.recipe_yaml import read_recipe_yaml


# -------------------------------------------------------------------------------------- stages
class Optim(Strict):
    name: Literal["adamw"] = "adamw"
    lr: float = Field(3e-4, gt=0, le=1.0)
    weight_decay: float = Field(0.0, ge=0, le=1.0)
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = Field(1e-8, gt=0)
    grad_clip: float | None = Field(1.0, gt=0)

    @model_validator(mode="after")
    def _betas(self) -> "Optim":
        if not all(0.0 <= b < 1.0 for b in self.betas):
            raise ValueError(f"betas must each lie in [0, 1), got {list(self.betas)}")
        return self


class Schedule(Strict):
    kind: Literal["cosine", "linear", "constant"] = "cosine"
    warmup_steps: int = Field(0, ge=0)
    min_lr_ratio: float = Field(0.1, ge=0, le=1)


class EvalSettings(Strict):
    every: int = Field(0, ge=0, description="steps between evaluations; 0 = only at the end")
    max_blocks: int = Field(32, gt=0)


class CheckpointSettings(Strict):
    every: int = Field(0, ge=0, description="steps between checkpoints; 0 = only at the end")


class NovaMixture(Strict):
    """Nova-style mixture: percentages of customer data plus curated categories, adding to 100."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    customer: dict[str, float] = Field(min_length=1)
    curated: dict[str, float] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _hundred(self) -> "NovaMixture":
        both = sorted(set(self.customer) & set(self.curated))
        if both:
            raise ValueError(f"{both} listed under both customer and curated; give each source once")
        total = sum(self.customer.values()) + sum(self.curated.values())
        if abs(total - 100.0) > 1e-6:
            raise ValueError(f"customer and curated percentages must add to 100, they add to {total:g}")
        return self

    def weights(self) -> dict[str, float]:
        return {**self.customer, **self.curated}


def _mixture_kind(value: Any) -> str:
    is_nova = isinstance(value, (dict, NovaMixture)) and ("customer" in value if isinstance(value, dict) else True)
    return "<nova>" if is_nova else "<weights>"


Mixture = Annotated[
    Union[Annotated[dict[str, Annotated[float, Field(allow_inf_nan=False)]], Tag("<weights>")],
          Annotated[NovaMixture, Tag("<nova>")]],
    Discriminator(_mixture_kind),
]


class PretrainStage(Strict):
    """Continued pretraining / mid-training: causal-LM loss over packed token blocks."""

    kind: Literal["pretrain"]
    name: str = Field(pattern=NAME)
    mixture: Mixture = Field(description="{source: weight} or {customer: {...}, curated: {...}} in percent")
    max_repeats: int | None = Field(None, ge=0, description="times a source may start over; None = no limit")
    on_exhausted: Literal["fail", "rebalance"] = Field(
        "fail", description="past max_repeats: stop, or share its weight among the other sources")
    max_tokens: int | None = Field(None, gt=0)
    max_steps: int | None = Field(None, gt=0)
    seq_len: int = Field(256, ge=8, le=1_048_576)
    batch_size: int = Field(8, gt=0)
    grad_accum: int = Field(1, gt=0)
    optim: Optim = Optim()
    schedule: Schedule = Schedule()
    precision: Literal["fp32", "bf16", "fp16"] = "fp32"
    seed: int = 0
    separator: Literal["eos", "bos"] = "eos"
    eval: EvalSettings = EvalSettings()
    checkpoint: CheckpointSettings = CheckpointSettings()
    log_every: int = Field(1, gt=0)

    @model_validator(mode="after")
    def _budget(self) -> "PretrainStage":
        if (self.max_tokens is None) == (self.max_steps is None):
            raise ValueError("give exactly one of 'max_tokens' or 'max_steps'")
        bad = {k: v for k, v in self.weights.items() if not v > 0}
        if not self.weights:
            raise ValueError("mixture: give at least one source")
        if bad:
            raise ValueError(f"mixture weights must be > 0, got {bad}")
        if self.schedule.warmup_steps and self.max_steps and self.schedule.warmup_steps >= self.max_steps:
            raise ValueError(
                f"schedule.warmup_steps ({self.schedule.warmup_steps}) must be below max_steps ({self.max_steps})"
            )
        return self

    @property
    def weights(self) -> dict[str, float]:
        """The mixture as {source: weight} (percentages are weights too)."""
        return self.mixture.weights() if isinstance(self.mixture, NovaMixture) else dict(self.mixture)

    @property
    def tokens_per_step(self) -> int:
        return self.batch_size * self.grad_accum * self.seq_len

    def total_steps(self, world_size: int = 1) -> int:
        if self.max_steps is not None:
            return self.max_steps
        per_step = self.tokens_per_step * world_size
        return max(1, -(-self.max_tokens // per_step))


def _stage_kind(value: Any) -> str | None:
    kind = value.get("kind") if isinstance(value, dict) else getattr(value, "kind", None)
    return f"<{kind}>" if kind in STAGE_KINDS else None


STAGE_KINDS = ("pretrain",)
# Tags in <brackets> cannot clash with user names in error paths (recipe_errors strips them).
Stage = Annotated[Union[Annotated[PretrainStage, Tag("<pretrain>")]],
                  Discriminator(_stage_kind, custom_error_type="stage_kind",
                                custom_error_message=f"'kind' must be one of {list(STAGE_KINDS)}")]


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
    def _heads(self) -> "ScratchBase":
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
    alias: str = Field("candidate", pattern=r"^[A-Za-z][A-Za-z0-9_-]*$")

    @field_validator("alias")
    @classmethod
    def _not_reserved(cls, v: str) -> str:
        if v.lower() == "latest":
            raise ValueError("'latest' is reserved by the MLflow registry; choose another alias, e.g. candidate")
        return v


class Compute(Strict):
    target: str = "local"
    chips: int | None = Field(None, gt=0)


class Recipe(Strict):
    name: str = Field(pattern=r"^[A-Za-z][A-Za-z0-9_.-]*$")
    pipeline: str = Field("novella", pattern=r"^[a-z_][a-z0-9_]*$")
    base: Annotated[Union[Annotated[str, Tag("<path>")], Annotated[Base, Tag("<scratch>")]],
                    Discriminator(lambda v: "<path>" if isinstance(v, str) else "<scratch>")]
    data: dict[Annotated[str, Field(pattern=NAME)], DataSource] = Field(min_length=1)
    stages: list[Stage] = Field(min_length=1)
    hygiene: HygieneSettings = HygieneSettings()
    tracking: Tracking = Tracking()
    compute: Compute = Compute()
    output: str

    @model_validator(mode="after")
    def _cross_refs(self) -> "Recipe":
        problems = []
        for i, stage in enumerate(self.stages):
            nova = isinstance(stage.mixture, NovaMixture)
            for src in stage.weights:
                if src not in self.data:
                    group = ("customer." if src in stage.mixture.customer else "curated.") if nova else ""
                    problems.append(
                        f"stages[{i}].mixture.{group}{src}: unknown data source; known: {sorted(self.data)}"
                    )
        for j, src in enumerate(self.hygiene.decontaminate_against):
            if src not in self.data:
                problems.append(f"hygiene.decontaminate_against[{j}]: unknown data source {src!r}")
        evals = set(self.hygiene.decontaminate_against)
        for i, stage in enumerate(self.stages):
            for src in stage.weights:
                if src in evals:
                    problems.append(f"stages[{i}].mixture.{src}: is an evaluation set "
                                    "(hygiene.decontaminate_against); a stage must not train on it")
                cfg = self.data.get(src)
                if cfg is not None and cfg.chat is not None and stage.kind == "pretrain":
                    problems.append(f"stages[{i}].mixture.{src}: data.{src} holds chat records (chat: ...), "
                                    "which a pretrain stage does not read; give it plain text")
        names = [s.name for s in self.stages]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            problems.append(f"stages: stage names must be unique, repeated: {dupes}")
        if isinstance(self.base, Base):
            for src in self.base.scratch.tokenizer_sources:
                if src not in self.data:
                    problems.append(f"base.scratch.tokenizer_sources: unknown data source {src!r}")
            for i, stage in enumerate(self.stages):
                if stage.seq_len > self.base.scratch.max_position:
                    problems.append(
                        f"stages[{i}].seq_len: {stage.seq_len} exceeds base.scratch.max_position "
                        f"({self.base.scratch.max_position})"
                    )
        if problems:
            raise ValueError("\n".join(problems))
        return self

    @property
    def tracking_uri(self) -> str:
        return self.tracking.uri or f"sqlite:///{Path(self.output).resolve() / 'mlflow.db'}"

    @property
    def experiment(self) -> str:
        return self.tracking.experiment or self.name


# ------------------------------------------------------------------------------------ loading
def _check_files(recipe: Recipe, lines: dict, where: str) -> list[str]:
    problems = []

    def at(path: tuple) -> str:
        return f"{where}:line {lines[path]}" if path in lines else where

    if isinstance(recipe.base, str) and not recipe.base.startswith("catalog://"):
        base = Path(recipe.base)
        if not (base / "config.json").is_file():
            problems.append(
                f"{at(('base',))}: base: {recipe.base!r} is not a Hugging Face checkpoint folder "
                "(expected a directory holding config.json)"
            )
        else:
            problems += [f"{at(('base',))}: base: {p}" for p in check_base(base)]  # forge/base_check.py
    elif isinstance(recipe.base, str):
        problems.append(
            f"{at(('base',))}: base: catalog references ({recipe.base!r}) are not available yet; "
            "give a local checkpoint folder or base.scratch"
        )
    for name, src in recipe.data.items():
        if src.path is None:
            continue
        if not (Path(src.path).exists() or glob.glob(src.path)):
            problems.append(f"{at(('data', name, 'path'))}: data.{name}.path: no file, folder or glob match for {src.path!r}")
    return problems


def _resolve_paths(raw: dict, root: Path) -> dict:
    """Paths in a recipe are relative to the recipe file (so recipes run from any directory)."""

    def fix(p: str) -> str:
        if "://" in p or os.path.isabs(p):
            return p
        return str((root / os.path.expanduser(p)).resolve()) if not p.startswith("~") else os.path.expanduser(p)

    out = copy.deepcopy(raw)
    if isinstance(out.get("base"), str):
        out["base"] = fix(out["base"])
    if isinstance(out.get("output"), str):
        out["output"] = fix(out["output"])
    for src in (out.get("data") or {}).values() if isinstance(out.get("data"), dict) else []:
        if isinstance(src, dict) and isinstance(src.get("path"), str):
            src["path"] = fix(src["path"])
    return out


def load_recipe(path: str | os.PathLike, overrides: list[str] | None = None) -> Recipe:
    """Load, override and validate a recipe; raise ForgeError listing every problem found."""
    path = Path(path)
    where = str(path)
    if not path.is_file():
        raise ForgeError(f"{where}: recipe file not found")
    raw, lines = read_recipe_yaml(path)  # UTF-8, duplicate keys, alias bombs and nesting checked there
    if not isinstance(raw, dict):
        raise ForgeError(f"{where}: a recipe must be a YAML mapping (name, base, data, stages, output)")
    raw, origins = apply_overrides(raw, overrides or [])
    raw = _resolve_paths(raw, path.parent.resolve())
    try:
        recipe = Recipe.model_validate(raw)
    except ValidationError as e:
        raise ForgeError("\n".join(format_errors(e, Recipe, where, lines, origins))) from None
    problems = _check_files(recipe, lines, where)
    if problems:
        raise ForgeError("\n".join(problems))
    return recipe


def resolved_yaml(recipe: Recipe) -> str:
    """The recipe as it will run (defaults filled, overrides applied, paths absolute)."""
    return yaml.safe_dump(recipe.model_dump(mode="json"), sort_keys=False)
