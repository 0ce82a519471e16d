"""The parallelism seam: a strategy name (the recipe's `parallelism.strategy`) picks how a
session's model and optimizer are wrapped for the launch and which checkpointer saves them.

Only `ddp` exists today (accelerate's DistributedDataParallel on several processes, nothing on
one); a sharded strategy (FSDP2 with DCP checkpoints) is one more entry here and one more
Checkpointer class, not edits in the loop or the stages.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from forge.errors import ForgeError
from forge.train.checkpointer import Checkpointer, FullCheckpointer, Process


@dataclass(frozen=True)
class Strategy:
    prepare: Callable[[Any, torch.nn.Module, torch.optim.Optimizer], tuple[torch.nn.Module, torch.optim.Optimizer]]
    checkpointer: Callable[[Process], Checkpointer]


def _ddp_prepare(accelerator: Any, model: torch.nn.Module,
                 optimizer: torch.optim.Optimizer) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model, optimizer = accelerator.prepare(model, optimizer)
    return model, optimizer


STRATEGIES: dict[str, Strategy] = {"ddp": Strategy(_ddp_prepare, FullCheckpointer)}


def strategy(name: str, where: str = "parallelism.strategy") -> Strategy:
    if name not in STRATEGIES:
        raise ForgeError(f"{where}: {name!r} is not a parallelism strategy; allowed: {', '.join(STRATEGIES)}")
    return STRATEGIES[name]


def checkpointer(name: str, process: Process) -> Checkpointer:
    """The checkpointer of a strategy, for work outside a session (souping, merge-back)."""
    return strategy(name).checkpointer(process)
