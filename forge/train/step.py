"""One optimizer step over micro-batches, and the divergence guard.

The step's gradient is the sum of token losses over every micro-batch (and every rank) divided
by the number of target tokens in the whole step, so `batch_size=2, grad_accum=4` gives the
gradient of `batch_size=8, grad_accum=1` even when micro-batches hold different numbers of
target tokens (OLMo-core's token-sum normalisation). Each micro-batch's mean loss is weighted by
its share of the step's tokens; DDP and FSDP average gradients over ranks, hence the factor `world`.
"""
from __future__ import annotations

import contextlib
import math
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol

import torch

from forge.errors import ForgeError
from forge.train import fsdp
from forge.train.losses import Loss, target_count
from forge.train.session import Session
from forge.train.signals import GracefulStop


Record = tuple[str, int]  # (data source, record number): a record a batch holds
SHOWN = 5  # records a guard message names; the rest are counted (all are in the run's guard/step-N.txt)


class Divergence(ForgeError):
    """Training diverged (non-finite or spiking loss) and the guard stopped the stage."""


@dataclass
class StepResult:
    loss: float               # token-weighted mean loss of the step, all ranks
    grad_norm: float | None
    lr: float                 # the rate this step used
    targets: int              # target tokens in the step, all ranks
    skipped: str | None = None  # why the guard skipped the update
    halt: bool = False        # some rank was asked to stop (every rank sees the same)
    stat_sums: dict[str, float] = field(default_factory=dict)  # this rank's sum of stat x targets


class Guard(Protocol):
    """The recipe's `guard:` block (forge.recipe.settings.Guard), read by attribute."""

    @property
    def spike_factor(self) -> float | None: ...
    @property
    def window(self) -> int: ...
    @property
    def action(self) -> str: ...  # stop, skip
    @property
    def max_skips(self) -> int: ...


class DivergenceGuard:
    """Trips on a non-finite loss or gradient norm, or on a loss above spike_factor x the mean of
    the last `window` accepted losses; then stops the stage or skips the batch (`action`)."""

    def __init__(self, cfg: Guard, where: str, name: Callable[[list[Record]], list[str]] | None = None):
        self.cfg, self.where, self.name = cfg, where, name  # name: records as `source file:line`
        self.recent: deque[float] = deque(maxlen=cfg.window)
        self.skipped = 0
        self.last_good_checkpoint: Path | None = None  # set by the stage as it writes checkpoints
        self.batch: list[Record] = []  # the records of this rank's step being taken (set by the loop)
        self.named: list[str] = []     # the last tripped step's records, named
        self.note = ""                 # the last skip's message

    def problem(self, loss: float, grad_norm: float | None) -> str | None:
        if not math.isfinite(loss):
            return f"loss became {loss}"
        if grad_norm is not None and not math.isfinite(grad_norm):
            return f"gradient norm became {grad_norm}"
        spike = self.cfg.spike_factor
        if spike and len(self.recent) == self.recent.maxlen:
            mean = sum(self.recent) / len(self.recent)
            if loss > spike * mean:
                return f"loss {loss:.4g} spiked above {spike:g} x its running mean {mean:.4g}"
        return None

    def trip(self, step: int, why: str) -> None:
        """Name the step's records; raise Divergence (action stop, or too many skips), else count a
        skip and keep its message in `note`."""
        self.skipped += 1
        self.named = self.name(self.batch) if self.name is not None and self.batch else []
        held = self.held(step)
        if self.cfg.action == "skip" and self.skipped <= self.cfg.max_skips:
            self.note = f"{self.where}: {why} at step {step}{held}; skipped the batch"
            return
        kept = (f"last good checkpoint: {self.last_good_checkpoint}" if self.last_good_checkpoint
                else "no checkpoint was written before it")
        extra = f" (skipped {self.skipped - 1} step(s) before)" if self.cfg.action == "skip" else ""
        raise Divergence(f"{self.where}: {why} at step {step}{extra}{held}; stopped ({kept}). Lower optim.lr, "
                         "raise guard.spike_factor, set guard.action: skip, or use precision fp32")

    def held(self, step: int) -> str:
        """'; the batch held: a f:3, b g:9 and 4 more (guard/step-N.txt)', or '' when not traced."""
        if not self.named:
            return ""
        more = len(self.named) - SHOWN
        rest = f" and {more} more (all in the run's guard/step-{step}.txt)" if more > 0 else ""
        return f"; the batch held: {', '.join(self.named[:SHOWN])}{rest}"

    def accept(self, loss: float) -> None:
        self.recent.append(loss)

    def state_dict(self) -> dict[str, Any]:
        return {"recent": list(self.recent), "skipped": self.skipped}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.recent.clear()
        self.recent.extend(state["recent"])
        self.skipped = state["skipped"]


def _no_sync(session: Session) -> Any:
    """No gradient reduction on a step's micro-batches before its last (DDP's no_sync, FSDP2's flag)."""
    model = session.model
    return fsdp.no_sync(model) if fsdp.is_sharded(model) else session.accelerator.no_sync(model)


def _clip(session: Session, max_norm: float) -> float:
    """Clip to `max_norm` and return the global gradient norm (over every shard under fsdp)."""
    if fsdp.is_sharded(session.model):
        session.accelerator.unscale_gradients()  # fp16's loss scale, as accelerate's own clip does
        return fsdp.clip_grad_norm(session.model, max_norm)
    return float(session.accelerator.clip_grad_norm_(session.model.parameters(), max_norm))


def train_step(session: Session, batches: list[Any], loss_fn: Callable[[torch.nn.Module, Any], Any],
               guard: DivergenceGuard, step: int, stop: GracefulStop | None = None) -> StepResult:
    """Accumulate `batches` (this rank's micro-batches), all-reduce, guard, clip, step. `loss_fn`
    returns a micro-batch's mean loss, or a `Loss` with the kind's statistics. Whether any rank was
    asked to stop (`stop.requested`, read after the backward passes) travels in the loss's all-reduce."""
    acc, model = session.accelerator, session.model
    world = acc.num_processes
    counts = [target_count(b) for b in batches]
    local = sum(counts)
    total = local if world == 1 else int(acc.reduce(torch.tensor(local, device=acc.device), "sum").item())
    step_loss = torch.zeros((), device=acc.device)
    sums: dict[str, float] = {}
    for i, (batch, n) in enumerate(zip(batches, counts)):
        last = i == len(batches) - 1
        batch = batch.to(acc.device) if isinstance(batch, torch.Tensor) else {k: v.to(acc.device) for k, v in batch.items()}
        with (contextlib.nullcontext() if last else _no_sync(session)):
            with acc.autocast():
                out = loss_fn(model, batch)
            mean = out.value if isinstance(out, Loss) else out
            loss = mean * (n * world / max(total, 1))
            acc.backward(loss)
        step_loss += loss.detach()
        for k, v in (out.stats if isinstance(out, Loss) else {}).items():
            sums[k] = sums.get(k, 0.0) + float(v) * n
    stop_requested = bool(stop is not None and stop.requested)
    if world == 1:
        loss_value, halt = step_loss.item(), stop_requested
    else:  # every rank sees the same loss (the guard decides alike) and the same stop
        both = acc.reduce(torch.stack([step_loss, torch.tensor(float(stop_requested), device=acc.device)]), "sum")
        loss_value, halt = both[0].item() / world, bool(both[1].item() > 0)
    grad_norm = None
    why = guard.problem(loss_value, None)
    if why is None:
        clip = session.settings.optim.grad_clip
        grad_norm = _clip(session, clip if clip else float("inf"))
        why = guard.problem(loss_value, grad_norm)
    lr = session.scheduler.get_last_lr()[0]
    if why is None:
        session.optimizer.step()
        guard.accept(loss_value)
    else:
        guard.trip(step, why)  # raises unless the batch is to be skipped
    session.scheduler.step()
    session.optimizer.zero_grad(set_to_none=True)
    return StepResult(loss_value, grad_norm, lr, total, why, halt, sums)
