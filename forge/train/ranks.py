"""What the ranks of a launch agree on without a host sync each step: the tokens and statistics
the loop logs (summed over ranks only when read) and whether to stop (checked about once a second)."""
from __future__ import annotations

import torch

from forge.train.meter import Meter
from forge.train.session import Session
from forge.train.signals import GracefulStop
from forge.train.state import TrainState
from forge.train.step import StepResult


class Ranks:
    """Figures summed over ranks only when they are read (at the log interval, checkpoints, the end);
    until then they stay where the step left them (tokens and statistics as device tensors)."""

    def __init__(self, s: Session):
        self.s = s
        self.tokens: int | torch.Tensor = 0
        self.targets: torch.Tensor | int = 0
        self.stats: dict[str, torch.Tensor] = {}

    def add(self, tokens: int | torch.Tensor, out: StepResult) -> None:
        self.tokens = self.tokens + tokens
        self.stats, self.targets = out.stat_sums, out.targets  # the last step's, per target

    def flush(self, state: TrainState, meter: Meter, stats: bool = True) -> dict[str, float]:
        """Add the real tokens since the last flush, summed over ranks, to `state` and `meter`; return
        the last step's statistics over all ranks (in the same all-reduce), or {} without `stats`.
        One host read: tokens (int64, exact) and the statistics (float32) travel as one int64 tensor
        and one float tensor, read together."""
        keys = sorted(self.stats) if stats else []
        device = self.s.device
        counts = torch.as_tensor(self.tokens).reshape(1).to(device, torch.int64)
        sums = torch.stack([self.stats[k].reshape(()).to(device, torch.float32) for k in keys]) if keys else None
        if self.s.world > 1:
            counts = self.s.accelerator.reduce(counts, "sum")
            sums = self.s.accelerator.reduce(sums, "sum") if sums is not None else None
        targets = torch.as_tensor(self.targets).reshape(1).to(device, torch.float32)
        read = torch.cat([counts.to(torch.float64), targets.to(torch.float64),
                          *([sums.to(torch.float64)] if sums is not None else [])]).tolist()
        self.tokens = 0
        state.tokens += int(read[0])
        meter.add(int(read[0]))
        return {k: v / max(read[1], 1.0) for k, v in zip(keys, read[2:])}


class Halt:
    """Whether any rank was asked to stop (SIGINT/SIGTERM), so that every rank stops at the same step.
    One process reads its own flag every step (free). Several agree through an all-reduce, a host
    sync, so it runs only at the loop's read points and every `every` steps, `every` set at each log
    step to about one second of steps (from the step time averaged over ranks, the same on each)."""

    def __init__(self, s: Session, stop: GracefulStop, log_every: int):
        self.s, self.stop, self.log_every, self.every = s, stop, log_every, log_every

    def check(self, step: int, read_point: bool) -> bool:
        if self.s.world == 1:
            return self.stop.requested
        if not read_point and step % self.every:
            return False
        flag = torch.tensor([float(self.stop.requested)], device=self.s.device)
        return bool(self.s.accelerator.reduce(flag, "sum").tolist()[0] > 0)

    def pace(self, step_seconds: float) -> None:
        """At a log step, on every rank: check about once a second from now on."""
        if self.s.world > 1:
            seconds = self.s.accelerator.reduce(torch.tensor([step_seconds], device=self.s.device), "mean")
            step_seconds = seconds.tolist()[0]
        self.every = max(1, min(self.log_every, int(1.0 / max(step_seconds, 1e-6))))
