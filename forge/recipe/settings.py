"""Per-stage settings: what every training stage shares (TrainSettings, Optim, Schedule, Guard, ...)
and the settings class of each stage kind, each a StageSettings (forge/recipe/registry.py) that
registers itself under its `kind`. The kinds table (forge.kinds) names the stage module and the
planner workload that belong to each kind."""
from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import ConfigDict, Discriminator, Field, Tag, model_validator

from forge.recipe.data import NAME, Strict
from forge.recipe.registry import StageSettings


class Optim(Strict):
    model_config = ConfigDict(extra="forbid", validate_default=True, allow_inf_nan=False)
    name: Literal["adamw"] = "adamw"
    lr: float = Field(3e-4, gt=0, le=1.0)
    weight_decay: float = Field(0.0, ge=0, le=1.0)
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = Field(1e-8, gt=0, le=1.0)
    grad_clip: float | None = Field(1.0, gt=0)
    carry_over: bool = Field(False, description="start from the input checkpoint's optimizer moments")
    fused: bool | None = Field(None, description="one fused AdamW kernel per step (default: on an accelerator "
                               "such as CUDA; off on CPU, where the per-tensor loop keeps the reference numbers)")

    @model_validator(mode="after")
    def _betas(self) -> Optim:
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
    max_blocks: int = Field(32, gt=0, description="held-out blocks per data source")


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


class MergeBack(Strict):
    """Merge-back (Nova's model-importance weight): the stage's output becomes
    `weight * trained + (1 - weight) * input` before it flows on."""

    model_config = ConfigDict(extra="forbid", validate_default=True, allow_inf_nan=False)
    weight: float = Field(gt=0, lt=1, description="share of the trained weights; the rest is the stage's input")


class TrainSettings(StageSettings):
    """What every training stage shares: budget, shapes, optimizer, schedule, precision, seed,
    evaluation, checkpoints, guard and logging. Stage kinds add their own fields to these."""

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
    compile: bool = Field(False, description="torch.compile each decoder layer (as torchtitan does): faster steps "
                          "on a GPU after a one-off compilation at the first step")
    flush_denormals: bool = Field(True, description="CPU training: treat floats below 1.2e-38 as zero in every "
                                  "torch thread (FTZ/DAZ); 1.4x faster SFT steps on stories260K, where the "
                                  "attention backward took a slow path on each (bench/bench_sft.py)")
    merge: MergeBack | None = Field(None, description="interpolate the output back toward the input weights")

    @model_validator(mode="after")
    def _budget(self) -> TrainSettings:
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
    def _hundred(self) -> NovaMixture:
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
    Annotated[dict[str, Annotated[float, Field(allow_inf_nan=False)]], Tag("<weights>")] | Annotated[NovaMixture, Tag("<nova>")],
    Discriminator(_mixture_kind),
]


# --------------------------------------------------------------------------------- stage kinds
class PretrainStage(TrainSettings):
    """Continued pretraining: causal-LM loss over packed token blocks of a mixture."""

    kind: Literal["pretrain"]
    evaluates: ClassVar[tuple[str, ...]] = ("perplexity",)
    mixture: Mixture = Field(description="{source: weight} or {customer: {...}, curated: {...}} in percent")
    max_repeats: int | None = Field(None, ge=0, description="times a source may start over; None = no limit")
    on_exhausted: Literal["fail", "rebalance"] = Field(
        "fail", description="past max_repeats: stop, or share its weight among the other sources")
    separator: Literal["eos", "bos"] = "eos"

    @model_validator(mode="after")
    def _mixture(self) -> PretrainStage:
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
        return self.weights

    def source_paths(self) -> dict[str, str]:
        nova = isinstance(self.mixture, NovaMixture)
        return {src: "mixture." + (("customer." if src in self.mixture.customer else "curated.") if nova else "") + src
                for src in self.weights}

    def mixture_warning(self) -> str | None:
        """Weights that add to neither 1 nor 100 (0.7 + 0.5): accepted, since the mixture trains on
        their shares, but said, with those shares (a Nova mixture's percentages must add to 100)."""
        if isinstance(self.mixture, NovaMixture):
            return None
        total = sum(self.weights.values())
        if any(abs(total - whole) <= 1e-6 * whole for whole in (1.0, 100.0)):
            return None
        shares = ", ".join(f"{name} {weight / total:.1%}" for name, weight in self.weights.items())
        return (f"mixture: weights add to {total:g}, not 1 (or 100 as percentages); they are used as shares: "
                f"{shares}")


def mixture_warnings(stages: list[Any]) -> list[str]:
    """`stages[i].mixture: ...` for each stage whose mixture weights are shares only once normalized."""
    found = [(i, s.mixture_warning()) for i, s in enumerate(stages) if isinstance(s, PretrainStage)]
    return [f"stages[{i}].{text}" for i, text in found if text]


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
    def _something(self) -> ContextExtension:
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


class SoupStage(StageSettings):
    """Checkpoint souping: the (weighted) average of earlier stages' or folders' weights."""

    kind: Literal["soup"]
    ingredients: list[str] = Field(min_length=2, description="stage names (earlier in the recipe) or checkpoint folders")
    weights: list[Annotated[float, Field(gt=0, allow_inf_nan=False)]] | None = Field(
        None, description="one per ingredient; default uniform")

    @model_validator(mode="after")
    def _weights(self) -> SoupStage:
        if self.weights is not None and len(self.weights) != len(self.ingredients):
            raise ValueError(f"give one weight per ingredient ({len(self.ingredients)}), got {len(self.weights)}")
        return self


# ----------------------------------------------------------------------------- post-training
class Lora(Strict):
    """Low-rank adapters through `peft` (Hu et al. 2021): only the adapters train. `merge`: fold them
    into the weights on save (a plain Hugging Face model), else save the adapter in PEFT's format
    with its base checkpoint as reference (then the stage must be the recipe's last)."""

    model_config = ConfigDict(extra="forbid", validate_default=True, allow_inf_nan=False)
    r: int = Field(8, gt=0, le=4096)
    alpha: float = Field(16.0, gt=0)
    dropout: float = Field(0.0, ge=0, lt=1)
    target_modules: list[str] = Field(["q_proj", "v_proj"], min_length=1)
    merge: bool = True


class Samples(Strict):
    """A table of sample generations (prompt, completion[, rewards]) logged every `every` steps."""

    every: int = Field(0, ge=0, description="steps between sample tables; 0 = none")
    prompts: int = Field(4, gt=0, le=256)
    max_new_tokens: int = Field(32, gt=0, le=4096)


class PostTrainSettings(TrainSettings):
    """What SFT, DPO and RFT share: the data sources (chat records), LoRA, sample tables."""

    data: list[Annotated[str, Field(pattern=NAME)]] = Field(min_length=1, description="data sources (chat records)")
    lora: Lora | None = None
    samples: Samples = Samples()
    seq_len: int = Field(512, ge=8, le=1_048_576)

    @model_validator(mode="after")
    def _lora(self) -> PostTrainSettings:
        if self.lora is not None and self.merge is not None and not self.lora.merge:
            raise ValueError("merge: merge-back needs full weights; set lora.merge: true or drop merge")
        if self.lora is not None and self.checkpoint.every:
            raise ValueError("checkpoint.every: LoRA stages write no resumable checkpoints yet; set it to 0")
        return self

    @property
    def sources(self) -> dict[str, float]:
        return {name: 1.0 for name in self.data}

    def source_paths(self) -> dict[str, str]:
        paths: dict[str, str] = {}
        for j, name in enumerate(self.data):
            paths.setdefault(name, f"data[{j}]")
        return paths


class SftStage(PostTrainSettings):
    """Supervised fine-tuning on chat records: loss on assistant tokens (or all), examples packed
    best-fit into seq_len blocks with per-example position ids, or padded per batch. A plain-text
    source among `data` is replayed (language modelling on every token, in the same batches):
    curated general text against forgetting, or the domain's documents."""

    kind: Literal["sft"]
    reads: ClassVar[str] = "chat"
    replays_text: ClassVar[bool] = True  # plain-text sources in `data` are replayed (forge.stages.replay)
    evaluates: ClassVar[tuple[str, ...]] = ("perplexity",)
    train_on: Literal["assistant", "all"] | None = Field(
        None, description="tokens that carry loss; default: the data source's chat.loss_on")
    packing: Literal["best_fit", "pad"] = "best_fit"
    replay_distill: float = Field(
        0.0, ge=0, le=1, description="on replayed plain-text tokens, this share of the loss is the KL divergence from "
        "replay_teacher's next-token distribution (distillation against forgetting; it runs the teacher forward on "
        "the rows that hold replayed text, which best_fit packing keeps in blocks of their own); 0: plain language "
        "modelling. A proprietary source (documents to learn) is never distilled: it keeps the plain loss")
    replay_teacher: Literal["input", "base"] = Field(
        "input", description="replay_distill's teacher: the stage's input model, or the pipeline's base (the "
        "checkpoint the recipe starts from: what the retention check compares with)")
    repeat: dict[Annotated[str, Field(pattern=NAME)], Annotated[int, Field(ge=1, le=100)]] = Field(
        default_factory=dict, description="{source: times}: each training example of that source in `data` appears "
        "this many times an epoch (default once; held-out examples once): a small set worth more updates than its "
        "size gives, such as fill-in-the-blank questions beside a large question-answer set")
    schedule: Schedule = Schedule(kind="cosine", min_lr_ratio=0.0)

    @model_validator(mode="after")
    def _repeat(self) -> SftStage:
        twice = sorted({name for name in self.data if self.data.count(name) > 1})
        if twice:
            raise ValueError(f"data: {', '.join(twice)} listed more than once; to train on a source's examples "
                             f"more often, set repeat: {{{twice[0]}: 2}}")
        unknown = sorted(set(self.repeat) - set(self.data))
        if unknown:
            raise ValueError(f"repeat: {', '.join(unknown)} not among the stage's data ({', '.join(self.data)})")
        return self

    @property
    def sources(self) -> dict[str, float]:
        return {name: float(self.repeat.get(name, 1)) for name in self.data}


class DpoStage(PostTrainSettings):
    """Direct preference optimisation on (prompt, chosen, rejected) pairs; the reference is the
    stage's input checkpoint. `batch_size` counts pairs."""

    model_config = ConfigDict(extra="forbid", validate_default=True, allow_inf_nan=False)
    kind: Literal["dpo"]
    reads: ClassVar[str] = "preference"
    evaluates: ClassVar[tuple[str, ...]] = ("perplexity", "preference")
    beta: float = Field(0.1, gt=0, le=100)
    label_smoothing: float = Field(0.0, ge=0, lt=0.5, description="cDPO: assumed share of flipped labels (sigmoid)")
    loss: Literal["sigmoid", "ipo"] = "sigmoid"
    reference: Literal["cached", "live"] = Field(
        "cached", description="cached: reference log-probs computed once and kept on disk; live: every step")
    batch_size: int = Field(4, gt=0, le=1_048_576)
    optim: Optim = Optim(lr=5e-6)
    schedule: Schedule = Schedule(kind="cosine", min_lr_ratio=0.0)

    @model_validator(mode="after")
    def _ipo(self) -> DpoStage:
        if self.loss == "ipo" and self.label_smoothing:
            raise ValueError("label_smoothing applies to the sigmoid loss only; set it to 0 for ipo")
        return self
