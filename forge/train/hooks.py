"""The training loop's side concerns as hooks, in the style of OLMo-core's callbacks: the loop
(forge.train.loop) calls each hook of its list, in order, at fixed points of a run, and a hook
sees the run through `Run`. Each can be driven alone (tests/train/test_hooks.py).

- `GuardLog`: the divergence guard's trips, logged to the run with the records of the bad step.
- `Evaluation`: held-out figures of the starting model, every `eval.every` steps, and at the end.
- `Samples`: sample generations every `samples.every` steps.
- `Checkpoints`: the resume point a run continues (tagged), and one every `checkpoint.every`
  steps and at a requested stop.
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field
from typing import Protocol

from forge.progress import phase, say
from forge.train.meter import Meter
from forge.train.ranks import Ranks
from forge.train.session import Session
from forge.train.state import TrainState
from forge.train.step import Divergence, DivergenceGuard, StepResult


class Tracker(Protocol):
    """What the loop logs to (forge.track's tracker, or a test's recorder)."""

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None: ...
    def set_tags(self, tags: dict[str, str]) -> None: ...
    def log_text(self, text: str, artifact_file: str) -> None: ...


@dataclass
class Run:
    """A running loop as its hooks see it."""

    session: Session
    tracker: Tracker
    state: TrainState
    guard: DivergenceGuard
    ranks: Ranks
    resumed: bool = False  # the run continues from session.resume_from
    meter: Meter = field(default_factory=Meter)  # training throughput (set when the steps start)
    halt: bool = False     # a stop was asked: this step writes a resume point, then the stage stops
    loss: float = math.nan  # the last logged loss

    def last(self, step: int) -> bool:
        return step == self.session.total_steps


class Hook:
    """A side concern of the loop. Every method does nothing unless a hook overrides it."""

    def start(self, run: Run) -> None:
        """Before the first step, once the resume point (if any) is restored."""

    def after_update(self, run: Run, step: int, out: StepResult) -> None:
        """Right after a step's update, before its figures are counted."""

    def reads(self, run: Run, step: int) -> bool:
        """Whether `post_step` reads the model or the step's figures after `step`: the guard judges
        the steps before then, and several ranks check for a stop (a read point)."""
        return False

    def post_step(self, run: Run, step: int) -> None:
        """After a step (and its log line), throughput paused."""

    def end(self, run: Run, metrics: dict[str, float]) -> None:
        """After the last step: add to the stage's metrics."""

    def on_error(self, run: Run, error: Exception) -> None:
        """The loop stops on `error`; it is raised again once every hook has seen it."""


class GuardLog(Hook):
    """The divergence guard's trips, logged to the run: a skipped step's message (said on the main
    process too) and the message a stop raised, each as a tag and as guard/step-N.txt with the
    records of that step's batches on this rank."""

    def after_update(self, run: Run, step: int, out: StepResult) -> None:
        if out.skipped is not None:
            if run.session.is_main:
                say(run.guard.note)
            self._log(run, step, run.guard.note)

    def on_error(self, run: Run, error: Exception) -> None:
        if isinstance(error, Divergence):  # raised by the step, or by a settle at a read point
            self._log(run, run.guard.tripped_at, str(error))

    @staticmethod
    def _log(run: Run, step: int, message: str) -> None:
        run.tracker.set_tags({f"guard.step-{step}": message})
        listed = [message, "", f"records in this rank's batches ({len(run.guard.named)}):", *run.guard.named]
        run.tracker.log_text("\n".join(listed) + "\n", f"guard/step-{step}.txt")


class Evaluates(Protocol):
    """A kind's held-out evaluation (forge.train.task.Task has these)."""

    @property
    def evaluates(self) -> bool: ...
    def evaluate(self, step: int) -> dict[str, float]: ...


class Evaluation(Hook):
    """Held-out figures, logged at their step: of the starting model (into the metrics as `*_start`;
    not when resuming), every `every` steps before the last, and of the trained model (into the
    stage's metrics)."""

    def __init__(self, task: Evaluates, every: int) -> None:
        self.task, self.every = task, every

    def start(self, run: Run) -> None:
        if not run.resumed:
            with self._shown(run, "the starting model"):
                run.state.metrics.update({f"{k}_start": v for k, v in self._figures(run, 0).items()})

    def reads(self, run: Run, step: int) -> bool:
        return bool(self.every and step % self.every == 0 and not run.last(step))

    def post_step(self, run: Run, step: int) -> None:
        if self.reads(run, step):
            self._figures(run, step)

    def end(self, run: Run, metrics: dict[str, float]) -> None:
        with self._shown(run, "the trained model"):
            metrics.update(self._figures(run, run.session.total_steps))

    def _figures(self, run: Run, step: int) -> dict[str, float]:
        row = self.task.evaluate(step) if self.task.evaluates else {}
        if row:
            run.tracker.log_metrics(row, step=step)
        return row

    def _shown(self, run: Run, what: str) -> contextlib.AbstractContextManager[None]:
        s = run.session
        return phase(f"{s.settings.name}: evaluating {what}", enabled=s.is_main and self.task.evaluates)


class Sampler(Protocol):
    """A kind's sample generations (forge.train.task.Task has these)."""

    @property
    def samples_every(self) -> int: ...
    def samples(self, step: int) -> None: ...


class Samples(Hook):
    """The kind's sample generations every `samples_every` steps (the last one included)."""

    def __init__(self, task: Sampler) -> None:
        self.task = task

    def reads(self, run: Run, step: int) -> bool:
        return bool(self.task.samples_every and step % self.task.samples_every == 0)

    def post_step(self, run: Run, step: int) -> None:
        if self.reads(run, step):
            self.task.samples(step)


class Checkpoints(Hook):
    """Resume points: a resumed run is tagged with the one it continues; one is written every `every`
    steps before the last (the stage's output is the last step's), and at the step a stop was asked
    at. The guard names the newest in its messages."""

    def __init__(self, every: int) -> None:
        self.every = every

    def start(self, run: Run) -> None:
        if run.resumed:
            run.tracker.set_tags({"resumed_from": str(run.session.resume_from)})
            run.guard.last_good_checkpoint = run.session.resume_from

    def reads(self, run: Run, step: int) -> bool:
        return bool(self.every and step % self.every == 0 and not run.last(step))

    def post_step(self, run: Run, step: int) -> None:
        if not run.last(step) and (run.halt or (self.every and step % self.every == 0)):
            run.ranks.flush(run.state, run.meter, stats=False)  # the tokens so far, into the saved state
            run.guard.last_good_checkpoint = run.session.save_resumable(run.state)
