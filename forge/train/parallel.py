"""The parallelism seam: the recipe's `parallelism:` block (or a strategy name alone) picks how a
session's model and optimizer are wrapped for the launch and which checkpointer saves them.

- `ddp`: accelerate's DistributedDataParallel on several processes (nothing on one); every rank
  holds the whole model; FullCheckpointer (rank 0 writes Hugging Face folders).
- `fsdp`: FSDP2 (`fully_shard` per decoder layer and at the root, forge.train.fsdp): parameters,
  gradients and optimizer state sharded over the ranks (full, or hybrid: sharded within a node and
  replicated across nodes), optionally bf16 compute and CPU offload; ShardedCheckpointer (DCP
  resume points, a gathered Hugging Face folder as the output).

`shard` runs before the optimizer is built (FSDP2 replaces the parameters), `prepare` after it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import torch

from forge.errors import ForgeError
from forge.train import fsdp
from forge.train.checkpointer import Checkpointer, FullCheckpointer, Process
from forge.train.fsdp import Options, options
from forge.train.settings import ParallelismSettings
from forge.train.sharded import ShardedCheckpointer

if TYPE_CHECKING:  # imported when a session opens, not with the module
    from accelerate import Accelerator


def _no_shard(model: torch.nn.Module, opts: Options, device: torch.device) -> torch.nn.Module:
    return model


def _ddp_prepare(accelerator: Accelerator, model: torch.nn.Module,
                 optimizer: torch.optim.Optimizer) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model, optimizer = accelerator.prepare(model, optimizer)
    return model, optimizer


def _as_is(accelerator: Accelerator, model: torch.nn.Module,
           optimizer: torch.optim.Optimizer) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    return model, optimizer


@dataclass(frozen=True)
class Strategy:
    prepare: Callable[[Accelerator, torch.nn.Module, torch.optim.Optimizer], tuple[torch.nn.Module, torch.optim.Optimizer]]
    checkpointer: Callable[[Process], Checkpointer]
    shard: Callable[[torch.nn.Module, Options, torch.device], torch.nn.Module] = _no_shard
    sharded: bool = False  # the weights are split over the ranks: every rank takes part in each forward


STRATEGIES: dict[str, Strategy] = {
    "ddp": Strategy(_ddp_prepare, FullCheckpointer),
    "fsdp": Strategy(_as_is, ShardedCheckpointer, fsdp.shard, sharded=True),
}


def strategy(spec: ParallelismSettings | str, where: str = "parallelism.strategy") -> Strategy:
    """The strategy of a name or a `parallelism:` block."""
    name = options(spec).strategy
    if name not in STRATEGIES:
        raise ForgeError(f"{where}: {name!r} is not a parallelism strategy; allowed: {', '.join(STRATEGIES)}")
    return STRATEGIES[name]


def checkpointer(spec: ParallelismSettings | str, process: Process) -> Checkpointer:
    """The checkpointer of a strategy, for work outside a session (souping, merge-back)."""
    return strategy(spec).checkpointer(process)
