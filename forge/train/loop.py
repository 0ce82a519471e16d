"""The one training loop. `fit(session, task, tracker)` runs every training kind: it restores the
resume point (and tags it), evaluates the start, steps the optimizer over the task's micro-batches,
logs at `log_every` (reducing across ranks only then), evaluates, samples and checkpoints at their
cadences, stops gracefully on a signal, and writes the stage's final checkpoint and metrics.

A stage file brings only what is its own, as a `Task`: how its batches are made, its loss (with
its statistics), its evaluation, its samples and its final figures.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

import torch

from forge.data.sources import name_records
from forge.train.denormals import flush_denormals
from forge.train.meter import Meter
from forge.train.progress import phase, progress, say
from forge.train.result import StageResult
from forge.train.session import Session
from forge.train.signals import GracefulStop, StopRequested
from forge.train.state import TrainState
from forge.train.step import Divergence, DivergenceGuard, Record, StepResult, train_step


class Tracker(Protocol):
    """What the loop logs to (forge.track's tracker, or a test's recorder)."""

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None: ...
    def set_tags(self, tags: dict[str, str]) -> None: ...
    def log_text(self, text: str, artifact_file: str) -> None: ...


class Stream(Protocol):
    """A task's data: its position is part of the resume state."""

    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state: dict[str, Any]) -> None: ...


@dataclass
class Outcome:
    """What a kind adds at the end: its own final metrics, tokens per source, lineage and tags."""

    metrics: dict[str, float] = field(default_factory=dict)
    tokens_by_source: dict[str, int] = field(default_factory=dict)
    lineage: dict[str, Any] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)


@dataclass
class Task:
    """A stage kind's part of training. `batches()` gives this rank's micro-batches of the next step;
    `loss(model, batch)` a micro-batch's mean loss (or a forge.train.losses.Loss with statistics);
    `tokens(batches)` the real tokens of a step's micro-batches on this rank. `evaluate(step)` returns held-out figures
    (the loop logs them), `samples(step)` logs sample generations, `before_step(step)` runs untimed
    work ahead of a step (RFT's rollouts), `row(result)` adds the kind's own figures to a log line
    (called on every rank, at the log interval only), and `finish(state)` its final figures.
    `records()` gives the (source, record number) of the records in the micro-batches handed out
    since its last call (this rank's; the loop takes them after each `batches()`), and `sources`
    names them `source file:line` when the guard skips or stops a step."""

    batches: Callable[[], list[Any]]
    loss: Callable[[torch.nn.Module, Any], Any]
    data: Stream
    tokens: Callable[[list[Any]], int]
    finish: Callable[[TrainState], Outcome]
    evaluate: Callable[[int], dict[str, float]] | None = None
    samples: Callable[[int], None] | None = None
    before_step: Callable[[int], None] | None = None
    row: Callable[[StepResult], dict[str, float]] | None = None
    chat_template: str | None = None  # saved with the tokenizer (post-training)
    postfix: str = ""                 # the progress bar's extra figure, a key of the log row
    records: Callable[[], list[Record]] | None = None
    sources: dict[str, Any] = field(default_factory=dict)  # data source name -> forge.data.sources.Source


class _Ranks:
    """Figures summed over ranks only when they are read (at the log interval, checkpoints, the end)."""

    def __init__(self, s: Session):
        self.s, self.tokens, self.targets = s, 0, 0
        self.stats: dict[str, float] = {}

    def add(self, tokens: int, out: StepResult) -> None:
        self.tokens += tokens
        self.stats, self.targets = out.stat_sums, out.targets  # the last step's, per target

    def flush(self, state: TrainState, meter: Meter, stats: bool = True) -> dict[str, float]:
        """Add the real tokens since the last flush, summed over ranks, to `state` and `meter`; return
        the last step's statistics over all ranks (in the same all-reduce), or {} without `stats`."""
        keys = sorted(self.stats) if stats else []
        local = torch.tensor([float(self.tokens)] + [self.stats[k] for k in keys], dtype=torch.float64)
        if self.s.world > 1:
            local = self.s.accelerator.reduce(local.to(self.s.device), "sum").cpu()
        self.tokens = 0
        values = local.tolist()
        state.tokens += int(values[0])
        meter.add(int(values[0]))
        return {k: v / max(self.targets, 1) for k, v in zip(keys, values[1:])}


def _evaluate(task: Task, tracker: Tracker, step: int) -> dict[str, float]:
    row = task.evaluate(step) if task.evaluate is not None else {}
    if row:
        tracker.log_metrics(row, step=step)
    return row


def _start(s: Session, task: Task, tracker: Tracker, state: TrainState, guard: DivergenceGuard) -> None:
    """Continue from the resume point (tagged on the run), or evaluate the starting model."""
    if s.restore(state):
        tracker.set_tags({"resumed_from": str(s.resume_from)})
        guard.last_good_checkpoint = s.resume_from
    else:
        shown = s.is_main and task.evaluate is not None
        with phase(f"{s.settings.name}: evaluating the starting model", enabled=shown):
            state.metrics.update({f"{k}_start": v for k, v in _evaluate(task, tracker, 0).items()})


def _log(s: Session, task: Task, tracker: Tracker, state: TrainState,
         ctx: tuple[Meter, _Ranks, StepResult]) -> dict[str, float]:
    meter, ranks, out = ctx
    stats = ranks.flush(state, meter)
    tps = meter.window_tokens_per_s()
    row = {"loss": out.loss, "lr": out.lr, "tokens_per_s": tps, **meter.utilisation(tps), "tokens": state.tokens,
           **stats, **(task.row(out) if task.row is not None else {})}
    if out.grad_norm is not None:
        row["grad_norm"] = out.grad_norm
    tracker.log_metrics(row, step=state.step)
    return row


def _periodic(s: Session, task: Task, tracker: Tracker, state: TrainState, ctx: tuple[Meter, _Ranks, StepResult],
              guard: DivergenceGuard) -> None:
    """Evaluation, samples and a resume point at their cadences (throughput paused); then the stop."""
    meter, ranks, out = ctx
    step, cfg, last = state.step, s.settings, state.step == s.total_steps
    with meter.paused():
        if cfg.eval.every and step % cfg.eval.every == 0 and not last:
            _evaluate(task, tracker, step)
        if task.samples is not None and cfg.samples.every and step % cfg.samples.every == 0:
            task.samples(step)
        if not last and (out.halt or (cfg.checkpoint.every and step % cfg.checkpoint.every == 0)):
            ranks.flush(state, meter, stats=False)
            guard.last_good_checkpoint = s.save_resumable(state)
    if out.halt and not last:
        raise StopRequested(cfg.name, step, guard.last_good_checkpoint)


def _traced_step(s: Session, task: Task, tracker: Tracker, at: tuple[DivergenceGuard, int],
                 stop: GracefulStop) -> tuple[list[Any], StepResult]:
    """One step over the task's next batches; a step the guard skips or stops at has its message and
    the records of its batches logged to the run (guard/step-N.txt and a tag)."""
    guard, step = at
    batches = task.batches()
    guard.batch = list(dict.fromkeys(task.records())) if task.records is not None else []  # each record once
    try:
        out = train_step(s, batches, task.loss, guard, step, stop)
    except Divergence as e:
        _log_trip(tracker, guard, step, str(e))
        raise
    if out.skipped is not None:
        if s.is_main:
            say(guard.note)
        _log_trip(tracker, guard, step, guard.note)
    return batches, out


def _log_trip(tracker: Tracker, guard: DivergenceGuard, step: int, message: str) -> None:
    tracker.set_tags({f"guard.step-{step}": message})
    listed = [message, "", f"records in this rank's batches ({len(guard.named)}):", *guard.named]
    tracker.log_text("\n".join(listed) + "\n", f"guard/step-{step}.txt")


def fit(s: Session, task: Task, tracker: Tracker) -> StageResult:
    """Train the session's model on the task to `s.total_steps`; save `out_dir/final` and return
    the metrics (the kind's, the loop's: loss, tokens, throughput, memory, guard skips). On a CPU,
    denormal floats are flushed to zero meanwhile unless the stage sets `flush_denormals: false`."""
    with flush_denormals(s.settings.flush_denormals and s.device.type == "cpu"):
        return _fit(s, task, tracker)


def _fit(s: Session, task: Task, tracker: Tracker) -> StageResult:
    cfg = s.settings
    guard = DivergenceGuard(cfg.guard, f"stage {cfg.name}", lambda records: name_records(task.sources, records))
    state = TrainState(s.optimizer, s.scheduler, task.data, guard)
    _start(s, task, tracker, state, guard)
    meter, ranks, loss, row = Meter(s.place.flops, s.world), _Ranks(s), math.nan, {}
    bar = progress(s.total_steps, cfg.name, enabled=s.is_main)
    bar.update(state.step)
    with GracefulStop() as stop:
        for step in range(state.step + 1, s.total_steps + 1):
            if task.before_step is not None:
                with meter.paused():
                    task.before_step(step)
            batches, out = _traced_step(s, task, tracker, (guard, step), stop)
            state.step, loss = step, out.loss
            ranks.add(task.tokens(batches), out)
            meter.step()
            if step % cfg.log_every == 0 or step == s.total_steps:
                row = _log(s, task, tracker, state, (meter, ranks, out))
                figure = {task.postfix: f"{row[task.postfix]:.3f}"} if task.postfix in row else {}
                if "mfu" in row:
                    figure["mfu"] = f"{row['mfu']:.1%}"
                bar.set_postfix(loss=f"{out.loss:.3f}", tok_s=f"{row['tokens_per_s']:,.0f}", **figure)
            _periodic(s, task, tracker, state, (meter, ranks, out), guard)
            bar.update(1)
    bar.close()
    return _finish(s, task, tracker, state, (meter, loss, guard))


def _finish(s: Session, task: Task, tracker: Tracker, state: TrainState,
            ctx: tuple[Meter, float, DivergenceGuard]) -> StageResult:
    meter, loss, guard = ctx
    metrics = state.metrics
    metrics["loss"] = loss
    trained = meter.totals()  # training time only: the final evaluation is not a step's
    shown = s.is_main and task.evaluate is not None
    with phase(f"{s.settings.name}: evaluating the trained model", enabled=shown):
        metrics.update(_evaluate(task, tracker, s.total_steps))
    metrics["tokens"] = state.tokens
    metrics.update(trained)
    metrics["peak_mem_bytes"] = s.memory.peak_bytes()
    if guard.skipped:
        metrics["guard_skipped_steps"] = guard.skipped
    outcome = task.finish(state)
    metrics.update(outcome.metrics)
    if outcome.tags:
        tracker.set_tags(outcome.tags)
    result = StageResult(s.place.out_dir / "final", metrics, s.total_steps, outcome.tokens_by_source, outcome.lineage)
    s.save_final(state, result.as_dict(), task.chat_template)
    return result
