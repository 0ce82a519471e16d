"""Progress of long work: a bar (steps, tokens/s, loss, ETA) on a terminal; without one (CI,
`nohup`, a pipe) a plain line every `every` steps or `seconds` seconds, so batch logs show progress.
Both answer update / set_postfix / close, the interface the training loop uses."""
from __future__ import annotations

import sys
import time
from typing import Any, Protocol, TextIO

from tqdm.auto import tqdm


class Progress(Protocol):
    def update(self, n: int = 1) -> object: ...
    def set_postfix(self, **values: Any) -> None: ...
    def close(self) -> None: ...


def is_terminal() -> bool:
    return sys.stderr.isatty()


class LogProgress:
    """tqdm's small interface, printing `name: step 30/100 (30%), loss 3.21, tok/s 1,234, ETA 0:01:05`."""

    def __init__(self, total: int, desc: str, every: int | None = None, seconds: float = 30.0,
                 stream: TextIO | None = None):
        self.total, self.desc, self.n = total, desc, 0
        self.every = every or max(1, total // 10)  # about ten lines per stage, more if steps are slow
        self.seconds, self.stream = seconds, stream or sys.stderr
        self._postfix: dict[str, str] = {}
        self._start_n: int | None = None
        self._start_t = time.monotonic()
        self._last_n, self._last_t = 0, self._start_t

    def set_postfix(self, **values: Any) -> None:
        self._postfix = {k: str(v) for k, v in values.items()}

    def update(self, n: int = 1) -> None:
        if self._start_n is None:  # the first call sets the starting point (a resumed stage starts late)
            self._start_n, self._start_t = self.n + n, time.monotonic()
            self.n = self._last_n = self.n + n
            return
        self.n += n
        now = time.monotonic()
        if self.n - self._last_n >= self.every or now - self._last_t >= self.seconds or self.n == self.total:
            self._print(now)

    def _print(self, now: float) -> None:
        self._last_n, self._last_t = self.n, now
        parts = [f"{self.desc}: step {self.n}/{self.total} ({self.n / max(1, self.total):.0%})"]
        parts += [f"{k.replace('tok_s', 'tok/s')} {v}" for k, v in self._postfix.items()]
        done = self.n - (self._start_n or 0)
        if done > 0 and self.n < self.total:
            eta = (now - self._start_t) / done * (self.total - self.n)
            parts.append(f"ETA {int(eta // 3600)}:{int(eta % 3600 // 60):02d}:{int(eta % 60):02d}")
        print(", ".join(parts), file=self.stream, flush=True)

    def close(self) -> None:
        if self.n != self._last_n:
            self._print(time.monotonic())


class _Silent:
    def update(self, n: int = 1) -> None: ...
    def set_postfix(self, **values: Any) -> None: ...
    def close(self) -> None: ...


def progress(total: int, desc: str, enabled: bool = True) -> Progress:
    if not enabled:
        return _Silent()
    if is_terminal():
        bar: Progress = tqdm(total=total, desc=desc, unit="step", dynamic_ncols=True)
        return bar
    return LogProgress(total, desc)
