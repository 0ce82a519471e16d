"""What the training core reads of a stage's settings, as Protocols. The recipe's settings classes
(forge.recipe.settings) satisfy them, and mypy checks that they do (tests/typecheck/recipe_settings.py,
and where forge.stages hands a stage to `open_session`); the core itself never imports the recipe
(tests/test_layering.py). Members are read-only properties, so a recipe class may narrow a type (a
Literal for a str)."""
from __future__ import annotations

from typing import Protocol, Sequence


class OptimSettings(Protocol):
    """The `optim:` block."""

    @property
    def lr(self) -> float: ...
    @property
    def weight_decay(self) -> float: ...
    @property
    def betas(self) -> tuple[float, float]: ...
    @property
    def eps(self) -> float: ...
    @property
    def fused(self) -> bool | None: ...   # None: fused on an accelerator, the per-tensor loop on CPU
    @property
    def grad_clip(self) -> float | None: ...
    @property
    def carry_over(self) -> bool: ...     # start from the input checkpoint's optimizer moments


class ScheduleSettings(Protocol):
    """The `schedule:` block."""

    @property
    def kind(self) -> str: ...            # cosine, linear, constant, wsd, anneal
    @property
    def warmup_steps(self) -> int: ...
    @property
    def min_lr_ratio(self) -> float: ...
    @property
    def decay_fraction(self) -> float: ...  # wsd
    @property
    def decay(self) -> str: ...           # wsd: linear, cosine, sqrt


class GuardSettings(Protocol):
    """The `guard:` block (the divergence guard)."""

    @property
    def spike_factor(self) -> float | None: ...
    @property
    def window(self) -> int: ...
    @property
    def action(self) -> str: ...          # stop, skip
    @property
    def max_skips(self) -> int: ...


class Cadence(Protocol):
    """A block with `every` (steps; 0: never), such as `eval:`."""

    @property
    def every(self) -> int: ...


class CheckpointSettings(Protocol):
    """The `checkpoint:` block."""

    @property
    def every(self) -> int: ...
    @property
    def final_optimizer(self) -> bool: ...
    @property
    def keep_last_n(self) -> int | None: ...


class LoraSettings(Protocol):
    """The `lora:` block of a stage that trains adapters."""

    @property
    def r(self) -> int: ...
    @property
    def alpha(self) -> float: ...
    @property
    def dropout(self) -> float: ...
    @property
    def target_modules(self) -> Sequence[str]: ...
    @property
    def merge(self) -> bool: ...


class TrainSettings(Protocol):
    """A training stage's settings (forge.recipe.settings.TrainSettings and every kind's subclass)."""

    @property
    def name(self) -> str: ...
    @property
    def seq_len(self) -> int: ...
    @property
    def precision(self) -> str: ...       # fp32, bf16, fp16
    @property
    def seed(self) -> int: ...
    @property
    def log_every(self) -> int: ...
    @property
    def compile(self) -> bool: ...
    @property
    def flush_denormals(self) -> bool: ...
    @property
    def optim(self) -> OptimSettings: ...
    @property
    def schedule(self) -> ScheduleSettings: ...
    @property
    def eval(self) -> Cadence: ...
    @property
    def checkpoint(self) -> CheckpointSettings: ...
    @property
    def guard(self) -> GuardSettings: ...

    def total_steps(self, world_size: int = 1) -> int: ...


class ParallelismSettings(Protocol):
    """The recipe's `parallelism:` block (a strategy name alone stands for its defaults)."""

    @property
    def strategy(self) -> str: ...        # ddp, fsdp
    @property
    def sharding(self) -> str: ...        # full, hybrid
    @property
    def mixed_precision(self) -> str: ...  # none, bf16
    @property
    def activation_checkpointing(self) -> bool: ...
    @property
    def cpu_offload(self) -> bool: ...


class RopeScalingSettings(Protocol):
    """The `context.rope_scaling:` block: its `type` and the parameters transformers reads for it."""

    def model_dump(self) -> dict[str, object]: ...


class ContextSettings(Protocol):
    """A midtrain stage's `context:` block (context extension)."""

    @property
    def rope_theta(self) -> float | None: ...
    @property
    def rope_scaling(self) -> RopeScalingSettings | None: ...
