"""Graceful stop: the first SIGINT or SIGTERM asks the training loop to finish its step, write a
resumable checkpoint and stop; a second one stops at once."""
from __future__ import annotations

import signal
import sys
from pathlib import Path
from types import FrameType
from typing import Callable

from forge.errors import ForgeError

_SIGNALS = (signal.SIGINT, signal.SIGTERM)
Handler = Callable[[int, FrameType | None], object] | int | None  # a function, SIG_DFL or SIG_IGN, or None


class StopRequested(ForgeError):
    """A stage stopped on a signal after writing a resumable checkpoint."""

    stopped_on_request = True  # forge.track ends the runs KILLED, not FAILED

    def __init__(self, stage: str, step: int, checkpoint: Path | None):
        self.stage, self.step, self.checkpoint = stage, step, checkpoint
        super().__init__(f"stage {stage}: stopped on request after step {step}; "
                         f"resumable checkpoint: {checkpoint}")


class GracefulStop:
    """While active (a `with` block in the main thread), signals set `requested` instead of killing."""

    def __init__(self, announce: Callable[[str], object] = lambda msg: print(msg, file=sys.stderr, flush=True)):
        self.requested, self._announce = False, announce
        self._previous: dict[int, Handler] = {}  # signal: the handler it had (signal.signal's answer)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.requested:  # the second signal: at once, the way the process would have stopped
            if signum == signal.SIGINT:
                raise KeyboardInterrupt
            sys.exit(128 + signum)
        self.requested = True
        self._announce(f"forge: {signal.Signals(signum).name}: finishing the current step and writing a "
                       "checkpoint (send it again to stop at once)")

    def __enter__(self) -> GracefulStop:
        try:
            for sig in _SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        except ValueError:  # not the main thread: signals stay as they were
            self._previous = {}
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
