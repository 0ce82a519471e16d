"""Asynchronous rollouts for RFT (`rollout: {mode: off_policy_async, max_age: K}`): while a step
trains, a background thread makes the next rollout with forge's own generator on a copy of the
policy's weights (copied in at each rollout, the policy version noted). A rollout that has fallen
more than K versions behind when it is taken is dropped and made anew with the current weights; the
loss corrects the lag with truncated importance weights (rft.grpo_loss). With K = 0 nothing is made
ahead, so the results are those of synchronous GRPO.
"""
from __future__ import annotations

import copy
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable

import torch

Produce = Callable[[torch.nn.Module, int], Any]  # (model to sample with, the step it is for) -> a rollout


class Ahead:
    """The next rollout, made in one background thread on a copy of the policy."""

    def __init__(self, produce: Produce, model: torch.nn.Module, max_age: int):
        self.produce, self.max_age = produce, max_age
        self.copy = copy.deepcopy(model).eval() if max_age else None
        if self.copy is not None:
            self.copy.requires_grad_(False)
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="forge-rollout") if max_age else None
        self.pending: tuple[Future[Any], int, int] | None = None  # (its future, the step it is for, its version)
        self.dropped = 0   # rollouts dropped for being older than max_age
        self.ages: list[int] = []

    def take(self, model: torch.nn.Module, step: int, version: int) -> tuple[Any, int]:
        """(the rollout for `step`, its age in policy versions): the one made ahead unless it is too old
        (or was made for another step), else one made now with `model` (age 0)."""
        if self.pending is not None:
            future, made_for, made_at = self.pending
            self.pending = None
            rollout = future.result()  # its errors (a reward's, the environment's) surface here
            if made_for == step and version - made_at <= self.max_age:
                self.ages.append(version - made_at)
                return rollout, version - made_at
            self.dropped += 1
        self.ages.append(0)
        return self.produce(model, step), 0

    @torch.no_grad()
    def start(self, model: torch.nn.Module, step: int, version: int) -> None:
        """Copy the policy's weights (version `version`) and begin the rollout for `step` in the background."""
        if self.copy is None or self.pool is None:
            return
        for mine, theirs in zip(self.copy.state_dict().values(), model.state_dict().values()):
            mine.copy_(theirs)
        self.pending = (self.pool.submit(self.produce, self.copy, step), step, version)

    def figures(self) -> dict[str, float]:
        ages = self.ages or [0]
        return {"rollout.age": sum(ages) / len(ages), "rollout.dropped": float(self.dropped)}

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)
