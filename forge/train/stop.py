"""Graceful stop: the first SIGINT or SIGTERM asks the training loop to finish its step, write a
resumable checkpoint and stop; a second one stops at once."""
from __future__ import annotations

import signal
import sys

from forge.errors import ForgeError

_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopRequested(ForgeError):
    """A stage stopped on a signal after writing a resumable checkpoint."""

    stopped_on_request = True  # forge.track ends the runs KILLED, not FAILED

    def __init__(self, stage: str, step: int, checkpoint):
        self.stage, self.step, self.checkpoint = stage, step, checkpoint
        super().__init__(f"stage {stage}: stopped on request after step {step}; "
                         f"resumable checkpoint: {checkpoint}")


class GracefulStop:
    """While active (a `with` block in the main thread), signals set `requested` instead of killing."""

    def __init__(self, announce=lambda msg: print(msg, file=sys.stderr, flush=True)):
        self.requested, self._announce, self._previous = False, announce, {}

    def _handle(self, signum, frame) -> None:
        if self.requested:  # the second signal: at once, the way the process would have stopped
            if signum == signal.SIGINT:
                raise KeyboardInterrupt
            sys.exit(128 + signum)
        self.requested = True
        self._announce(f"forge: {signal.Signals(signum).name}: finishing the current step and writing a "
                       "checkpoint (send it again to stop at once)")

    def __enter__(self) -> "GracefulStop":
        try:
            for sig in _SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        except ValueError:  # not the main thread: signals stay as they were
            self._previous = {}
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def agreed(requested: bool, accelerator) -> bool:
    """Whether any rank was asked to stop (all ranks then checkpoint and stop at the same step)."""
    if accelerator.num_processes == 1:
        return requested
    import torch

    flag = torch.tensor(1.0 if requested else 0.0, device=accelerator.device)
    return bool(accelerator.reduce(flag, "sum").item() > 0)


def after_step(s, stage, state, guard, stop: GracefulStop, meter, step: int, evaluate=None, samples=None) -> None:
    """The periodic work after an optimizer step, with throughput paused: evaluation and samples every
    `eval.every` / `samples.every` steps, a resumable checkpoint every `checkpoint.every` steps or when
    a stop was asked for; then the stop itself. Shared by every training loop."""
    last = step == s.total_steps
    halt = agreed(stop.requested, s.accelerator)
    with meter.paused():
        if evaluate is not None and stage.eval.every and step % stage.eval.every == 0 and not last:
            evaluate(step)
        if samples is not None and stage.samples.every and step % stage.samples.every == 0:
            samples(step)
        if not last and (halt or (stage.checkpoint.every and step % stage.checkpoint.every == 0)):
            guard.last_good_checkpoint = s.save_resumable(state)
    if halt and not last:
        raise StopRequested(stage.name, step, guard.last_good_checkpoint)
