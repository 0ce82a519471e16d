"""Optimizer, optimizer carry-over and learning-rate schedules shared by every stage."""
from __future__ import annotations

import math
from typing import Callable

import torch
from torch.optim.optimizer import StateDict

from forge.train.accel import has_fused_adamw
from forge.train.settings import OptimSettings, ScheduleSettings


def build_optimizer(model: torch.nn.Module, cfg: OptimSettings, device: torch.device) -> torch.optim.Optimizer:
    """AdamW; weight decay on matrices only (not on norms and biases), as in GPT-3 / Llama training.
    Fused (one kernel for every parameter) when `cfg.fused`, or by default on an accelerator; the
    parameters must then already be on `device`, which torch checks when the optimizer is built."""
    decay: list[torch.nn.Parameter] = []
    no_decay: list[torch.nn.Parameter] = []
    for p in model.parameters():
        if p.requires_grad:
            (decay if p.ndim >= 2 else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    fused = cfg.fused if cfg.fused is not None else device.type != "cpu"
    if fused and not has_fused_adamw(device):
        if cfg.fused:
            from forge.errors import ForgeError

            raise ForgeError(f"optim.fused: true: torch has no fused AdamW for {device.type} devices; "
                             "remove optim.fused")
        fused = False  # the default on a device without the kernel: the per-tensor loop
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, fused=fused or None)


def lr_factor(step: int, total: int, cfg: ScheduleSettings) -> float:
    """Multiplier on the peak LR at `step` (0-based): linear warmup, then the schedule's shape.

    Progress runs from 0 after warmup to 1 at `total` (one past the last step), so the rate after
    the final step is the schedule's floor: min_lr_ratio, or 0 for `anneal`."""
    if step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    if cfg.kind == "constant":
        return 1.0
    floor = cfg.min_lr_ratio
    if cfg.kind == "wsd":  # warmup-stable-decay (Hu et al. 2024, MiniCPM; Hägele et al. 2024)
        decay_steps = max(1, round(cfg.decay_fraction * total))
        start = max(cfg.warmup_steps, total - decay_steps)
        if step < start:
            return 1.0
        progress = min(1.0, (step - start) / max(1, total - start))
        shape = {"linear": 1 - progress, "cosine": 0.5 * (1 + math.cos(math.pi * progress)),
                 "sqrt": 1 - math.sqrt(progress)}[cfg.decay]
        return floor + (1 - floor) * shape
    span = max(1, total - cfg.warmup_steps)
    progress = min(1.0, (step - cfg.warmup_steps) / span)
    if cfg.kind == "anneal":  # linear to zero (the ramp-down of a constant-LR run)
        return 1 - progress
    if cfg.kind == "linear":
        return floor + (1 - floor) * (1 - progress)
    return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))


def build_scheduler(optimizer: torch.optim.Optimizer, total_steps: int,
                    cfg: ScheduleSettings) -> torch.optim.lr_scheduler.LambdaLR:
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, total_steps, cfg))


def carry_over(optimizer: torch.optim.Optimizer, saved: StateDict, cfg: OptimSettings, where: str,
               load: Callable[[StateDict], None] | None = None) -> None:
    """Start from a previous stage's optimizer moments (Adam's m and v and step counts), keeping
    this stage's hyper-parameters (lr, betas, eps, weight decay). `load(saved)` puts the whole-model
    state into the optimizer (default: its load_state_dict; a sharded optimizer scatters it)."""
    from forge.errors import ForgeError

    keep = [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]
    try:
        (load or optimizer.load_state_dict)(saved)
    except (ValueError, KeyError) as e:
        raise ForgeError(f"{where}: optim.carry_over: the input's optimizer state does not match this model ({e})") from None
    for group, mine in zip(optimizer.param_groups, keep):
        for key in set(group) - set(mine) - {"params"}:  # e.g. the old schedule's initial_lr
            del group[key]
        group.update(mine)
