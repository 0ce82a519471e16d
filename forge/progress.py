"""Progress of long work, for every layer (a leaf: it imports nothing of forge): a bar on a terminal,
and without one (CI, `nohup`, a pipe) a plain line every ~10% or every `seconds`, never more; a
phase's one line saying what it is doing (`phase`), with a heartbeat while a phase of unknown
length runs long; all on stderr, so stdout keeps forge's results."""
from __future__ import annotations

import contextlib
import sys
import threading
import time
from typing import Any, Iterable, Iterator, Protocol, TextIO, TypeVar

T = TypeVar("T")
FIRST_LINE_S = 10.0  # a long count's first line comes after at most this long (then every `seconds`)
QUIET_S = 2.0  # a counted phase says nothing more than its total in its first seconds: quick work needs no count


class Progress(Protocol):
    def update(self, n: int = 1) -> object: ...
    def set_postfix(self, **values: Any) -> None: ...
    def close(self) -> None: ...


def is_terminal() -> bool:
    return sys.stderr.isatty()


def say(text: str) -> None:
    """One line on stderr, now (flushed: a pipe or a log file shows it at once)."""
    print(text, file=sys.stderr, flush=True)


def clock(seconds: float) -> str:
    """'0:01:05' for 65 s."""
    s = int(seconds)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


class LogProgress:
    """tqdm's small interface, printing `name: step 30/100 (30%), loss 3.21, tok/s 1,234, ETA 0:01:05`
    (`unit` names what is counted: step, batch, file, question, ...)."""

    def __init__(self, total: int, desc: str, every: int | None = None, seconds: float = 30.0,
                 stream: TextIO | None = None, unit: str = "step", after: float = 0.0):
        self.total, self.desc, self.n, self.unit = total, desc, 0, unit
        self.after, self._created = after, time.monotonic()  # no line in the first `after` seconds
        self.every = every or max(1, total // 10)  # about ten lines per stage, more if steps are slow
        self.seconds, self.stream = seconds, stream or sys.stderr
        self._postfix: dict[str, str] = {}
        self._start_n: int | None = None
        self._start_t = time.monotonic()
        self._last_n, self._last_t = 0, self._start_t
        self._printed = False

    def set_postfix(self, **values: Any) -> None:
        self._postfix = {k: str(v) for k, v in values.items()}

    def update(self, n: int = 1) -> None:
        if self._start_n is None:  # the first call sets the starting point (a resumed stage starts late)
            self._start_n, self._start_t = self.n + n, time.monotonic()
            self.n = self._last_n = self.n + n
            if self.n == self.total:
                self._print(self._start_t)
            return
        self.n += n
        now = time.monotonic()
        wait = self.seconds if self._printed else min(self.seconds, FIRST_LINE_S)  # the first ETA soon
        if self.n - self._last_n >= self.every or now - self._last_t >= wait or self.n == self.total:
            self._print(now)

    def _print(self, now: float) -> None:
        if now - self._created < self.after:
            return
        self._last_n, self._last_t, self._printed = self.n, now, True
        parts = [f"{self.desc}: {self.unit} {self.n}/{self.total} ({self.n / max(1, self.total):.0%})"]
        parts += [f"{k.replace('tok_s', 'tok/s')} {v}" for k, v in self._postfix.items()]
        done = self.n - (self._start_n or 0)
        if done > 0 and self.n < self.total:
            parts.append(f"ETA {clock((now - self._start_t) / done * (self.total - self.n))}")
        print(", ".join(parts), file=self.stream, flush=True)

    def close(self) -> None:
        if self.n != self._last_n:
            self._print(time.monotonic())


class _Silent:
    def update(self, n: int = 1) -> None: ...
    def set_postfix(self, **values: Any) -> None: ...
    def close(self) -> None: ...


def progress(total: int, desc: str, enabled: bool = True, unit: str = "step", seconds: float = 30.0,
             every: int | None = None, after: float = 0.0) -> Progress:
    """A bar on a terminal, else LogProgress (a line every `every` units, default ~10% of `total`,
    or every `seconds`; none in the first `after` seconds)."""
    if not enabled:
        return _Silent()
    if is_terminal():
        from tqdm.auto import tqdm  # here, not at import: a command's first line comes before it

        bar: Progress = tqdm(total=total, desc=desc, unit=unit, dynamic_ncols=True)
        return bar
    return LogProgress(total, desc, every=every, seconds=seconds, unit=unit, after=after)


def counted(items: Iterable[T], total: int, desc: str, unit: str = "batch", enabled: bool = True) -> Iterator[T]:
    """`items`, counted on a progress line (`desc: batch 3/12 (25%), ETA ...`) at every quarter or
    every 10 s, whichever comes first, and none in the first 2 s (a phase of a minute says so a
    handful of times, a quick one once); the first line, with the total, comes before the first
    item, so a slow first item is not silent."""
    if total <= 0:
        yield from items
        return
    if enabled and not is_terminal():
        say(f"{desc}: {total} {unit}{'es' if unit.endswith(('s', 'ch', 'sh')) else 's'}")
    bar = progress(total, desc, enabled, unit, seconds=10.0, every=max(1, -(-total // 4)), after=QUIET_S)
    bar.update(0)  # the starting point: none done
    try:
        for item in items:
            yield item
            bar.update(1)
    finally:
        bar.close()


@contextlib.contextmanager
def phase(text: str, enabled: bool = True, heartbeat: float = 15.0, done: bool = True) -> Iterator[None]:
    """Say what is being done (`text...`) before it starts; while it runs past `heartbeat` seconds,
    a line saying it still is (then at doubling intervals: a long phase is not a stream of lines);
    when it took more than a few seconds, how long (`done`)."""
    if not enabled:
        yield
        return
    say(f"{text}...")
    started, stop = time.monotonic(), threading.Event()

    def beat() -> None:
        wait = heartbeat
        while not stop.wait(wait):
            say(f"{text}: still working ({time.monotonic() - started:.0f} s)")
            wait *= 2

    ticker = threading.Thread(target=beat, daemon=True) if heartbeat > 0 else None
    if ticker is not None:
        ticker.start()
    try:
        yield
    finally:
        stop.set()
        if ticker is not None:
            ticker.join()
    took = time.monotonic() - started
    if done and took >= 3.0:
        say(f"{text}: done in {took:.0f} s")
