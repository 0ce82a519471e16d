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
from typing import Callable, TypeVar

import torch
from torch.optim.optimizer import StateDict

from forge.errors import ForgeError
from forge.train import fsdp
from forge.train.losses import Loss, target_count
from forge.train.session import Session
from forge.train.settings import GuardSettings

Record = tuple[str, int]  # (data source, record number): a record a batch holds
# a micro-batch: a block of token ids (pretraining), or named tensors (input_ids, labels, ...)
B = TypeVar("B", torch.Tensor, dict[str, torch.Tensor])
SHOWN = 5  # records a guard message names; the rest are counted (all are in the run's guard/step-N.txt)


class Divergence(ForgeError):
    """Training diverged (non-finite or spiking loss) and the guard stopped the stage."""


@dataclass
class StepResult:
    """One step's figures. The tensors stay on the device (0-d) until the loop reads them at a log
    step, a checkpoint or the end: reading one is a host sync, which a GPU pays for in idle time."""

    loss: torch.Tensor         # token-weighted mean loss of the step, all ranks
    grad_norm: torch.Tensor | None
    lr: float                  # the rate this step used
    targets: torch.Tensor      # target tokens in the step, all ranks
    skipped: str | None = None  # why the guard skipped the update
    stat_sums: dict[str, torch.Tensor] = field(default_factory=dict)  # this rank's sum of stat x targets


class DivergenceGuard:
    """Trips on a non-finite loss or gradient norm, or on a loss above spike_factor x the mean of
    the last `window` accepted losses; then stops the stage or skips the batch (`action`).

    With `action: stop` the guard reads nothing per step: `watch` keeps each step's loss and norm
    on the device, and `settle` reads them all at once at the loop's next log step, checkpoint or
    end, and stops at the first bad step, naming it and its records. Until then a bad step's update
    has been applied, but nothing is saved or evaluated before `settle`, so no checkpoint holds it.
    `action: skip` must decide before the update, so it reads the loss and norm every step."""

    def __init__(self, cfg: GuardSettings, where: str, name: Callable[[list[Record]], list[str]] | None = None):
        self.cfg, self.where, self.name = cfg, where, name  # name: records as `source file:line`
        self.recent: deque[float] = deque(maxlen=cfg.window)
        self.skipped = 0
        self.last_good_checkpoint: Path | None = None  # set by the stage as it writes checkpoints
        self.batch: list[Record] = []  # the records of this rank's step being taken (set by the loop)
        self.named: list[str] = []     # the last tripped step's records, named
        self.note = ""                 # the last skip's message
        self.tripped_at = 0            # the step the last trip named
        self.pending: list[tuple[int, torch.Tensor, list[Record]]] = []  # (step, [loss, norm], records)

    @property
    def deferred(self) -> bool:
        return self.cfg.action == "stop"

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

    def watch(self, step: int, loss: torch.Tensor, grad_norm: torch.Tensor) -> None:
        """Keep a step's figures (on the device) for `settle`."""
        self.pending.append((step, torch.stack([loss.detach(), grad_norm.detach().to(loss.dtype)]), list(self.batch)))

    def settle(self) -> None:
        """Judge the watched steps in order, with one host read: accept the good ones, trip at the
        first bad one (which raises: the deferred guard only stops)."""
        if not self.pending:
            return
        pending, self.pending = self.pending, []
        values = torch.stack([v for _, v, _ in pending]).tolist()
        for (step, _, records), (loss, norm) in zip(pending, values):
            why = self.problem(loss, norm)
            if why is not None:
                self.batch = records
                self.trip(step, why)
            self.accept(loss)

    def trip(self, step: int, why: str) -> None:
        """Name the step's records; raise Divergence (action stop, or too many skips), else count a
        skip and keep its message in `note`."""
        self.skipped += 1
        self.tripped_at = step
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

    def state_dict(self) -> StateDict:
        self.settle()  # a resume point holds only judged steps
        return {"recent": list(self.recent), "skipped": self.skipped}

    def load_state_dict(self, state: StateDict) -> None:
        self.recent.clear()
        self.recent.extend(state["recent"])
        self.skipped = state["skipped"]


def _no_sync(session: Session) -> contextlib.AbstractContextManager[None]:
    """No gradient reduction on a step's micro-batches before its last (DDP's no_sync, FSDP2's flag)."""
    model = session.model
    return fsdp.no_sync(model) if fsdp.is_sharded(model) else session.accelerator.no_sync(model)


def _clip(session: Session, max_norm: float) -> torch.Tensor:
    """Clip to `max_norm` and return the global gradient norm (over every shard under fsdp), on the device."""
    if fsdp.is_sharded(session.model):
        session.accelerator.unscale_gradients()  # fp16's loss scale, as accelerate's own clip does
        return fsdp.clip_grad_norm(session.model, max_norm)
    norm = session.accelerator.clip_grad_norm_(session.model.parameters(), max_norm)
    return norm if isinstance(norm, torch.Tensor) else torch.tensor(float(norm))


def _to(batch: B, device: torch.device) -> B:
    return batch.to(device) if isinstance(batch, torch.Tensor) else {k: v.to(device) for k, v in batch.items()}


def train_step(session: Session, batches: list[B], loss_fn: Callable[[torch.nn.Module, B], torch.Tensor | Loss],
               guard: DivergenceGuard, step: int) -> StepResult:
    """Accumulate `batches` (this rank's micro-batches), all-reduce, guard, clip, step. `loss_fn`
    returns a micro-batch's mean loss, or a `Loss` with the kind's statistics. Nothing is read to the
    host unless the guard skips bad steps (see DivergenceGuard): counts, loss and statistics are
    0-d tensors on the device."""
    acc, model = session.accelerator, session.model
    world = acc.num_processes
    batches = [_to(b, acc.device) for b in batches]
    counts = [target_count(b) for b in batches]  # ints for blocks of token ids, else 0-d tensors
    local: int | torch.Tensor = sum(counts)
    total: int | torch.Tensor = local if world == 1 else acc.reduce(torch.as_tensor(local, device=acc.device), "sum")
    share = total.clamp(min=1) if isinstance(total, torch.Tensor) else max(total, 1)  # 0 targets: a zero loss
    step_loss = torch.zeros((), device=acc.device)
    sums: dict[str, torch.Tensor] = {}
    for i, (batch, n) in enumerate(zip(batches, counts)):
        last = i == len(batches) - 1
        with (contextlib.nullcontext() if last else _no_sync(session)):
            with acc.autocast():
                out = loss_fn(model, batch)
            mean = out.value if isinstance(out, Loss) else out
            loss = mean * (n * world / share)
            acc.backward(loss)
        step_loss += loss.detach()
        for k, v in (out.stats if isinstance(out, Loss) else {}).items():
            sums[k] = sums.get(k, 0) + torch.as_tensor(v).detach().to(acc.device, torch.float32) * n
    if world > 1:  # every rank sees the same loss, so the guard decides alike
        step_loss = acc.reduce(step_loss, "sum") / world
    return apply_update(session, guard, step, step_loss, total, sums)


def apply_update(session: Session, guard: DivergenceGuard, step: int, step_loss: torch.Tensor,
                 total: int | torch.Tensor, sums: dict[str, torch.Tensor] | None = None) -> StepResult:
    """The second half of a step, once the gradients are accumulated: guard, clip, optimizer and
    schedule step, gradients cleared. Callers that take the backward passes themselves (forge serve,
    one per forward_backward call) end their step here, so every step ends the same way."""
    clip = session.settings.optim.grad_clip
    lr = float(session.scheduler.get_last_lr()[0])  # a python float: the optimizer takes no tensor lr
    skipped, grad_norm = _guarded_update(session, guard, step, (step_loss, clip if clip else float("inf")))
    session.scheduler.step()
    session.optimizer.zero_grad(set_to_none=True)
    return StepResult(step_loss, grad_norm, lr, torch.as_tensor(total), skipped, sums or {})


def _guarded_update(session: Session, guard: DivergenceGuard, step: int,
                    loss_clip: tuple[torch.Tensor, float]) -> tuple[str | None, torch.Tensor | None]:
    """Clip and step the optimizer; (why the guard skipped the update, the gradient norm). A skipping
    guard reads the loss first (and the norm), and a non-finite loss is not clipped."""
    step_loss, max_norm = loss_clip
    if guard.deferred:
        grad_norm = _clip(session, max_norm)
        guard.watch(step, step_loss, grad_norm)
        session.optimizer.step()
        return None, grad_norm
    loss_value, norm = float(step_loss), None
    why = guard.problem(loss_value, None)
    if why is None:
        norm = _clip(session, max_norm)
        why = guard.problem(loss_value, float(norm))
    if why is None:
        session.optimizer.step()
        guard.accept(loss_value)
    else:
        guard.trip(step, why)  # raises unless the batch is to be skipped
    return why, norm
