"""Optimizer and learning-rate schedules shared by every stage."""
from __future__ import annotations

import math

import torch

from forge.recipe import Optim, Schedule


def build_optimizer(model: torch.nn.Module, cfg: Optim) -> torch.optim.Optimizer:
    """AdamW; weight decay on matrices only (not on norms and biases), as in GPT-3 / Llama training."""
    decay, no_decay = [], []
    for p in model.parameters():
        if p.requires_grad:
            (decay if p.ndim >= 2 else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps)


def lr_factor(step: int, total: int, cfg: Schedule) -> float:
    """Multiplier on the peak LR at `step` (0-based): linear warmup, then cosine/linear/constant."""
    if step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    if cfg.kind == "constant":
        return 1.0
    span = max(1, total - cfg.warmup_steps)
    progress = min(1.0, (step - cfg.warmup_steps) / span)
    floor = cfg.min_lr_ratio
    if cfg.kind == "linear":
        return floor + (1 - floor) * (1 - progress)
    return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))


def build_scheduler(optimizer: torch.optim.Optimizer, total_steps: int, cfg: Schedule):
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, total_steps, cfg))
