"""Resume state: everything a stage needs to continue bitwise where it stopped, as one object
with state_dict() / load_state_dict(): step, tokens seen, metrics so far, data position, RNG,
optimizer, schedule and the divergence guard's window."""
from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Protocol, cast

import numpy as np
import torch
from torch.optim.optimizer import StateDict  # torch's type of a state_dict: values of every kind, read by key


class Resumable(Protocol):
    """Part of the resume state: a task's data stream (its position), the divergence guard (its window)."""

    def state_dict(self) -> StateDict: ...
    def load_state_dict(self, state: StateDict) -> None: ...


def rng_state() -> StateDict:
    """RNG states as plain types and tensors (loadable with torch.load(weights_only=True))."""
    # the global generator is MT19937: its legacy state tuple (numpy's stubs give the first overload, a dict)
    legacy = cast("tuple[str, np.ndarray[tuple[int], np.dtype[np.uint32]], int, int, float]",
                  np.random.get_state())
    name, keys, pos, has_gauss, cached = legacy
    return {"torch": torch.get_rng_state(), "python": random.getstate(),
            "numpy": [name, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, cached]}


def set_rng_state(state: StateDict) -> None:
    torch.set_rng_state(state["torch"])
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))


@dataclass
class TrainState:
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    data: Resumable
    guard: Resumable | None = None
    step: int = 0             # optimizer steps done
    tokens: int = 0           # tokens trained on (all ranks)
    metrics: dict[str, float] = field(default_factory=dict)  # the stage's figures so far (ints among them)

    def state_dict(self) -> StateDict:
        return {"step": self.step, "tokens": self.tokens, "metrics": dict(self.metrics),
                "data": self.data.state_dict(), "guard": self.guard.state_dict() if self.guard else None,
                "optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
                "rng": rng_state()}

    def load_state_dict(self, state: StateDict) -> None:
        self.step, self.tokens, self.metrics = state["step"], state.get("tokens", 0), dict(state["metrics"])
        self.data.load_state_dict(state["data"])
        if self.guard is not None and state.get("guard"):
            self.guard.load_state_dict(state["guard"])
        if "optimizer" in state:  # a sharded checkpointer has loaded it already (forge.train.sharded)
            self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        set_rng_state(state["rng"])
