"""Throughput that counts training time only: periodic evaluation and checkpoints run inside
`paused()`, so tokens/s and step time describe training steps (what the planner predicts). With
the model's FLOPs per token (and the chip's peak, where the catalog has it), each window also
gives the achieved FLOP/s per chip and the MFU."""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Iterator


@dataclass(frozen=True)
class Flops:
    """What turns tokens/s into MFU: model FLOPs per trained token (the planner's count) and one
    chip's peak FLOP/s at the stage's precision (None: no published peak, e.g. a CPU)."""

    per_token: float
    peak: float | None = None


class Meter:
    def __init__(self, flops: Flops | None = None, chips: int = 1) -> None:
        self.started = self._window_start = time.perf_counter()
        self.paused_seconds, self.steps, self._window_tokens, self.tokens = 0.0, 0, 0, 0
        self._window_steps, self.step_seconds = 0, 0.0  # step_seconds: the last window's mean step time
        self.flops, self.chips = flops, max(1, chips)

    def step(self) -> None:
        """One optimizer step done."""
        self.steps += 1
        self._window_steps += 1

    def add(self, tokens: int) -> None:
        """Real tokens trained on (all ranks), counted when the loop sums them over ranks."""
        self._window_tokens += tokens
        self.tokens += tokens

    def window_tokens_per_s(self) -> float:
        """Tokens/s since the last call (training time only)."""
        now = time.perf_counter()
        tps = self._window_tokens / max(now - self._window_start, 1e-9)
        if self._window_steps:
            self.step_seconds = (now - self._window_start) / self._window_steps
        self._window_start, self._window_tokens, self._window_steps = now, 0, 0
        return tps

    def utilisation(self, tokens_per_s: float) -> dict[str, float]:
        """Achieved model TFLOP/s per chip and, where the peak is known, MFU, at `tokens_per_s`
        (every rank's tokens); {} without FLOPs per token."""
        if self.flops is None:
            return {}
        per_chip = tokens_per_s * self.flops.per_token / self.chips
        out = {"tflops_per_chip": per_chip / 1e12}
        if self.flops.peak:
            out["mfu"] = per_chip / self.flops.peak
        return out

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            spent = time.perf_counter() - start
            self.paused_seconds += spent
            self._window_start += spent

    def totals(self) -> dict[str, float]:
        train = time.perf_counter() - self.started - self.paused_seconds
        steps = max(1, self.steps)
        mean = self.tokens / max(train, 1e-9)
        return {"train_seconds": train, "tokens_per_s_mean": mean, "step_time_s": train / steps,
                "eval_checkpoint_seconds": self.paused_seconds,
                **{f"{k}_mean": v for k, v in self.utilisation(mean).items()}}
