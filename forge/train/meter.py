"""Throughput that counts training time only: periodic evaluation and checkpoints run inside
`paused()`, so tokens/s and step time describe training steps (what the planner predicts)."""
from __future__ import annotations

import contextlib
import time
from typing import Iterator


class Meter:
    def __init__(self) -> None:
        self.started = self._window_start = time.perf_counter()
        self.paused_seconds, self.steps, self._window_tokens, self.tokens = 0.0, 0, 0, 0

    def step(self) -> None:
        """One optimizer step done."""
        self.steps += 1

    def add(self, tokens: int) -> None:
        """Real tokens trained on (all ranks), counted when the loop sums them over ranks."""
        self._window_tokens += tokens
        self.tokens += tokens

    def window_tokens_per_s(self) -> float:
        """Tokens/s since the last call (training time only)."""
        now = time.perf_counter()
        tps = self._window_tokens / max(now - self._window_start, 1e-9)
        self._window_start, self._window_tokens = now, 0
        return tps

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
        return {"train_seconds": train, "tokens_per_s_mean": self.tokens / max(train, 1e-9),
                "step_time_s": train / steps, "eval_checkpoint_seconds": self.paused_seconds}
