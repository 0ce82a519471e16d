"""One served model: a forge training session (forge.train.session.open_session: the base with
LoRA adapters, AdamW, the accelerator) driven call by call.

`forward_backward` answers the datums' log-probs and loss and takes their backward pass at once,
adding to the gradients of the step being accumulated (Tinker's loss is a plain sum over datums, so
no call waits for the others); `optim_step` then ends the step as forge's own training step does
(forge.train.step.apply_update: divergence guard, clipping, AdamW, gradients cleared), so the pair
is forge's SFT step on those tokens, guard and clipping included, with one forward pass per datum.
"""
from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from forge.serve import batch as batching
from forge.serve.losses import LossFn
from forge.serve.wire import AdamParams, LoraRequest, Refused
from forge.train.session import Session, open_session
from forge.train.step import DivergenceGuard, apply_update

# LoRA targets by the SDK's flags, for the Llama-style module names of forge's plain-head families
ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")
UNEMBED = ("lm_head",)


@dataclass
class Optim:  # forge.train.settings.OptimSettings; set from each optim_step's AdamParams
    lr: float = 1e-4
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-12
    fused: bool | None = None
    grad_clip: float | None = None
    carry_over: bool = False


@dataclass(frozen=True)
class Constant:  # forge.train.settings.ScheduleSettings: the client sets the rate of every step
    kind: str = "constant"
    warmup_steps: int = 0
    min_lr_ratio: float = 1.0
    decay_fraction: float = 1.0
    decay: str = "linear"


@dataclass(frozen=True)
class SkipNonFinite:  # forge.train.settings.GuardSettings: a non-finite loss or norm skips the update
    spike_factor: float | None = None
    window: int = 2
    action: str = "skip"
    max_skips: int = sys.maxsize


@dataclass(frozen=True)
class Never:  # eval: and checkpoint: blocks; the client drives both
    every: int = 0
    final_optimizer: bool = False
    keep_last_n: int | None = None


@dataclass
class Settings:  # forge.train.settings.TrainSettings of a served model
    name: str
    precision: str
    seed: int
    seq_len: int = 1  # open_session checks it against the context; each request is checked instead
    log_every: int = 1
    compile: bool = False
    flush_denormals: bool = False
    optim: Optim = field(default_factory=Optim)
    schedule: Constant = field(default_factory=Constant)
    eval: Never = field(default_factory=Never)
    checkpoint: Never = field(default_factory=Never)
    guard: SkipNonFinite = field(default_factory=SkipNonFinite)

    def total_steps(self, world_size: int = 1) -> int:
        return 1  # the constant schedule never reads it


@dataclass(frozen=True)
class Adapters:  # forge.train.settings.LoraSettings
    r: int
    alpha: float
    target_modules: tuple[str, ...]
    dropout: float = 0.0
    merge: bool = False


@dataclass(frozen=True)
class Place:  # forge.train.session.Place
    checkpoint: Path
    out_dir: Path
    resume: bool = False
    run_id: str | None = None
    parallelism: str = "ddp"
    flops: Any = None


def targets(lora: LoraRequest) -> tuple[str, ...]:
    chosen = (ATTENTION if lora.train_attn else ()) + (MLP if lora.train_mlp else ()) + \
        (UNEMBED if lora.train_unembed else ())
    if not chosen:
        raise Refused("lora_config: at least one of train_attn, train_mlp, train_unembed must be true")
    return chosen


@dataclass
class Forwarded:
    """One forward_backward's answer: per-datum log-probs and weighted losses, and their sum."""

    logprobs: list[np.ndarray]
    losses: list[np.ndarray]
    loss_sum: float


class ServedModel:
    def __init__(self, session: Session, settings: Settings, base: Path, adapters: Adapters):
        self.session, self.settings = session, settings  # settings: the object train_step reads the clip from
        self.base, self.adapters = base, adapters
        self.guard = DivergenceGuard(settings.guard, settings.name)
        # the step being accumulated: its summed loss, tokens and forward_backward calls
        self.step_loss = torch.zeros((), device=session.device)
        self.pending_tokens = self.pending_batches = 0
        self.steps = 0
        self.tokens = 0  # input tokens of every step so far
        self.losses: set[str] = set()  # the loss functions the steps used
        model: Any = session.unwrapped()
        self.limits = batching.Limits(int(model.config.vocab_size),
                                      getattr(model.config, "max_position_embeddings", None))

    @classmethod
    def open(cls, base: Path, lora: LoraRequest, alpha: float, settings: Settings, workdir: Path) -> ServedModel:
        adapters = Adapters(lora.rank, alpha, targets(lora))
        session = open_session(settings, Place(base, workdir), lora=adapters)
        return cls(session, settings, base, adapters)

    def forward_backward(self, items: list[batching.Example], seq_id: int, backward: bool, fn: LossFn) -> Forwarded:
        """The datums' log-probs and losses; with `backward`, their gradient is added to the next
        step's (Tinker's loss is a plain sum over datums, so each call's backward pass stands alone)."""
        tensors = batching.collate(items, self.session.pad_id, fn)
        device = self.session.device
        on_device = {k: v.to(device) for k, v in tensors.items()}
        with torch.set_grad_enabled(backward), self.session.accelerator.autocast():
            logp = batching.token_logprobs(self.session.model, on_device)
            losses = fn.per_token(logp, on_device) * on_device["attention_mask"]
            total = losses.sum()
        if backward:
            self.session.accelerator.backward(total)
            self.step_loss = self.step_loss + total.detach()
            self.pending_tokens += int(tensors["attention_mask"].sum())
            self.pending_batches += 1
            self.losses.add(fn.name)
        return Forwarded(batching.per_datum(logp, items), batching.per_datum(losses, items), float(total.detach()))

    def optim_step(self, adam: AdamParams) -> dict[str, float]:
        """forge's end of a training step (forge.train.step.apply_update: guard, clip, AdamW) over the
        gradients the forward_backward calls since the last step accumulated, with this step's Adam
        hyper-parameters (the route refuses other families). A non-finite loss or norm skips the
        update (forge's guard) and is left out of the metrics, which travel as JSON."""
        self._set_hyperparameters(adam)
        step_loss, tokens, batches = self.step_loss, self.pending_tokens, self.pending_batches
        self._clear()
        result = apply_update(self.session, self.guard, self.steps, step_loss, batches)
        self.steps += 1
        self.tokens += tokens
        metrics = {"learning_rate": adam.learning_rate, "loss:sum": float(result.loss), "tokens": float(tokens)}
        if result.grad_norm is not None:
            metrics["grad_norm"] = float(result.grad_norm)
        if result.skipped:
            metrics["skipped"] = 1.0
        return {k: v for k, v in metrics.items() if math.isfinite(v)}

    def _clear(self) -> None:
        """Forget the accumulated step (its gradients go at the update, or here when weights are loaded)."""
        self.step_loss = torch.zeros((), device=self.session.device)
        self.pending_tokens = self.pending_batches = 0

    def _set_hyperparameters(self, adam: AdamParams) -> None:
        """AdamParams into the optimizer's groups (decay on matrices only, as build_optimizer splits
        them) and the clip into the settings train_step reads (0: no clipping, as in Tinker)."""
        for group in self.session.optimizer.param_groups:
            group["lr"] = adam.learning_rate
            group["betas"] = (adam.beta1, adam.beta2)
            group["eps"] = adam.eps
            group["weight_decay"] = adam.weight_decay if any(p.ndim >= 2 for p in group["params"]) else 0.0
        self.settings.optim.grad_clip = adam.grad_clip_norm or None

    def adapter_state(self) -> dict[str, torch.Tensor]:
        """The adapters' weights under PEFT's saved names, copied to the CPU (a snapshot training
        does not change)."""
        from peft import get_peft_model_state_dict

        # the LoRA tensors alone: PEFT would add whole embedding matrices when lm_head is a target
        state: dict[str, torch.Tensor] = get_peft_model_state_dict(self.session.unwrapped(), save_embedding_layers=False)
        return {k: v.detach().to("cpu", copy=True) for k, v in state.items()}

    def load(self, adapter: dict[str, torch.Tensor], optimizer: dict[str, Any] | None, steps: int) -> None:
        """Saved adapters (PEFT's names) into the model, and the optimizer's moments when given (else
        none: moments of other weights would not fit these); the gradients accumulated since the last step
        are dropped: they were taken on the weights replaced."""
        from peft import set_peft_model_state_dict

        model = self.session.unwrapped()
        with torch.no_grad():
            result = set_peft_model_state_dict(model, adapter)
        unexpected = getattr(result, "unexpected_keys", [])
        if unexpected:
            raise Refused(f"the checkpoint's adapter does not fit this model: {sorted(unexpected)[:3]}")
        opt = self.session.optimizer
        if optimizer is None:
            opt.state.clear()
        else:
            opt.load_state_dict(optimizer)
        opt.zero_grad(set_to_none=True)
        self._clear()
        self.steps = steps
