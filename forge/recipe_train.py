"""Recipe schema, part two: the training settings every training stage shares (TrainSettings), and
the settings of each stage kind, which compose it. The table in forge.stages names which settings
class, stage module and planner workload belong to each kind."""
from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import ConfigDict, Discriminator, Field, Tag, model_validator

from forge.recipe_data import NAME, Strict


class Optim(Strict):
    model_config = ConfigDict(extra="forbid", validate_default=True, allow_inf_nan=False)
    name: Literal["adamw"] = "adamw"
    lr: float = Field(3e-4, gt=0, le=1.0)
    weight_decay: float = Field(0.0, ge=0, le=1.0)
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = Field(1e-8, gt=0, le=1.0)
    grad_clip: float | None = Field(1.0, gt=0)
    carry_over: bool = Field(False, description="start from the input checkpoint's optimizer moments")

    @model_validator(mode="after")
    def _betas(self) -> "Optim":
        if not all(0.0 <= b < 1.0 for b in self.betas):
            raise ValueError(f"betas must each lie in [0, 1), got {list(self.betas)}")
        return self


class Schedule(Strict):
    """Learning-rate schedule: linear warmup, then
    cosine / linear to `min_lr_ratio`; constant; `wsd` (warmup-stable-decay: constant, then over the
    last `decay_fraction` of steps a `decay`-shaped fall to `min_lr_ratio`, 0 allowed); `anneal`
    (linear from optim.lr to 0, Nova's ramp-down)."""

    model_config = ConfigDict(extra="forbid", validate_default=True, allow_inf_nan=False)
    kind: Literal["cosine", "linear", "constant", "wsd", "anneal"] = "cosine"
    warmup_steps: int = Field(0, ge=0)
    min_lr_ratio: float = Field(0.1, ge=0, le=1)
    decay_fraction: float = Field(0.2, gt=0, le=1, description="wsd: share of steps spent decaying")
    decay: Literal["linear", "cosine", "sqrt"] = Field("sqrt", description="wsd: decay shape (sqrt = 1-sqrt)")


class EvalSettings(Strict):
    every: int = Field(0, ge=0, description="steps between evaluations; 0 = only at the end")
    max_blocks: int = Field(32, gt=0)


class CheckpointSettings(Strict):
    every: int = Field(0, ge=0, description="steps between checkpoints; 0 = only at the end")
    final_optimizer: bool = Field(True, description="keep optimizer moments in the final checkpoint "
                                                    "(a later stage's optim.carry_over needs them)")
    keep_last_n: int | None = Field(None, ge=1, description="keep only the newest N step checkpoints; "
                                                           "None keeps all")


class Guard(Strict):
    """Divergence guard: a non-finite loss or gradient norm, or a loss above `spike_factor` times
    its running mean over `window` steps, stops the stage or skips the batch."""

    model_config = ConfigDict(extra="forbid", validate_default=True, allow_inf_nan=False)
    spike_factor: float | None = Field(None, gt=1, description="None: only non-finite values trip the guard")
    window: int = Field(20, ge=2, le=10_000)
    action: Literal["stop", "skip"] = "stop"
    max_skips: int = Field(10, ge=1, description="with action: skip, more skipped steps than this stop the stage")


class TrainSettings(Strict):
    """What every training stage shares: budget, shapes, optimizer, schedule, precision, seed,
    evaluation, checkpoints, guard and logging. Stage kinds add their own fields to these."""

    name: str = Field(pattern=NAME)
    max_tokens: int | None = Field(None, gt=0, le=10**16)
    max_steps: int | None = Field(None, gt=0, le=10**9)
    seq_len: int = Field(256, ge=8, le=1_048_576)
    batch_size: int = Field(8, gt=0, le=1_048_576)
    grad_accum: int = Field(1, gt=0, le=65_536)
    optim: Optim = Optim()
    schedule: Schedule = Schedule()
    precision: Literal["fp32", "bf16", "fp16"] = "fp32"
    seed: int = Field(0, ge=0, le=2**32 - 1)
    eval: EvalSettings = EvalSettings()
    checkpoint: CheckpointSettings = CheckpointSettings()
    guard: Guard = Guard()
    log_every: int = Field(1, gt=0)

    @model_validator(mode="after")
    def _budget(self) -> "TrainSettings":
        if (self.max_tokens is None) == (self.max_steps is None):
            raise ValueError("give exactly one of 'max_tokens' or 'max_steps'")
        if self.schedule.warmup_steps and self.max_steps and self.schedule.warmup_steps >= self.max_steps:
            raise ValueError(
                f"schedule.warmup_steps ({self.schedule.warmup_steps}) must be below max_steps ({self.max_steps})"
            )
        return self

    @property
    def tokens_per_step(self) -> int:
        return self.batch_size * self.grad_accum * self.seq_len

    def total_steps(self, world_size: int = 1) -> int:
        if self.max_steps is not None:
            return self.max_steps
        per_step = self.tokens_per_step * world_size
        return max(1, -(-self.max_tokens // per_step))


# ------------------------------------------------------------------------------------ mixtures
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


# --------------------------------------------------------------------------------- stage kinds
class PretrainStage(TrainSettings):
    """Continued pretraining: causal-LM loss over packed token blocks of a mixture."""

    kind: Literal["pretrain"]
    mixture: Mixture = Field(description="{source: weight} or {customer: {...}, curated: {...}} in percent")
    max_repeats: int | None = Field(None, ge=0, description="times a source may start over; None = no limit")
    on_exhausted: Literal["fail", "rebalance"] = Field(
        "fail", description="past max_repeats: stop, or share its weight among the other sources")
    separator: Literal["eos", "bos"] = "eos"

    @model_validator(mode="after")
    def _mixture(self) -> "PretrainStage":
        if not self.weights:
            raise ValueError("mixture: give at least one source")
        bad = {k: v for k, v in self.weights.items() if not v > 0}
        if bad:
            raise ValueError(f"mixture weights must be > 0, got {bad}")
        return self

    @property
    def weights(self) -> dict[str, float]:
        """The mixture as {source: weight} (percentages are weights too)."""
        return self.mixture.weights() if isinstance(self.mixture, NovaMixture) else dict(self.mixture)

    @property
    def sources(self) -> dict[str, float]:
        """The data sources this stage reads, with their weights (every stage kind has this)."""
        return self.weights


class RopeScaling(Strict):
    """A RoPE scaling of a type transformers implements (checked against the installed version)."""

    model_config = ConfigDict(extra="allow", validate_default=True, allow_inf_nan=False)
    type: Literal["linear", "dynamic", "yarn", "llama3", "longrope"]
    factor: float = Field(gt=1, le=1024)


class ContextExtension(Strict):
    """Context extension: the new context is the stage's seq_len (or `max_position`)."""

    model_config = ConfigDict(extra="forbid", validate_default=True, allow_inf_nan=False)
    rope_theta: float | None = Field(None, gt=0)
    rope_scaling: RopeScaling | None = None
    max_position: int | None = Field(None, ge=16, description="context length written to config.json; default seq_len")

    @model_validator(mode="after")
    def _something(self) -> "ContextExtension":
        if self.rope_theta is None and self.rope_scaling is None:
            raise ValueError("give rope_theta and/or rope_scaling (type, factor)")
        return self


class MidtrainStage(PretrainStage):
    """Mid-training (Nova's mid-trained checkpoint): the pretraining loop with a decaying schedule
    (default: anneal to 0), optimizer carry-over and optional context extension."""

    kind: Literal["midtrain"]  # type: ignore[assignment]
    schedule: Schedule = Schedule(kind="anneal")
    context: ContextExtension | None = None

    def context_length(self) -> int:
        return (self.context.max_position or self.seq_len) if self.context else self.seq_len


class SoupStage(Strict):
    """Checkpoint souping: the (weighted) average of earlier stages' or folders' weights."""

    kind: Literal["soup"]
    name: str = Field(pattern=NAME)
    ingredients: list[str] = Field(min_length=2, description="stage names (earlier in the recipe) or checkpoint folders")
    weights: list[Annotated[float, Field(gt=0, allow_inf_nan=False)]] | None = Field(
        None, description="one per ingredient; default uniform")

    @model_validator(mode="after")
    def _weights(self) -> "SoupStage":
        if self.weights is not None and len(self.weights) != len(self.ingredients):
            raise ValueError(f"give one weight per ingredient ({len(self.ingredients)}), got {len(self.weights)}")
        return self

    @property
    def sources(self) -> dict[str, float]:
        return {}


def stage_union(kinds: dict[str, type]) -> Any:
    """The recipe's `stages[i]` type: a union of the kinds' settings, chosen by `kind`."""

    def kind_of(value: Any) -> str | None:
        kind = value.get("kind") if isinstance(value, dict) else getattr(value, "kind", None)
        return f"<{kind}>" if kind in kinds else None

    # Tags in <brackets> cannot clash with user names in error paths (recipe_errors strips them).
    members = tuple(Annotated[cls, Tag(f"<{kind}>")] for kind, cls in kinds.items())
    return Annotated[Union[members], Discriminator(kind_of, custom_error_type="stage_kind",
                                                   custom_error_message=f"'kind' must be one of {list(kinds)}")]
