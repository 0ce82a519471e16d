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
from forge.progress import phase, progress, say
from forge.train.denormals import flush_denormals
from forge.train.meter import Meter
from forge.train.result import StageResult
from forge.train.session import Session
from forge.train.signals import GracefulStop, StopRequested
from forge.train.state import Resumable, TrainState
from forge.train.step import Divergence, DivergenceGuard, Record, StepResult, train_step


class Tracker(Protocol):
    """What the loop logs to (forge.track's tracker, or a test's recorder)."""

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None: ...
    def set_tags(self, tags: dict[str, str]) -> None: ...
    def log_text(self, text: str, artifact_file: str) -> None: ...


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
    data: Resumable
    tokens: Callable[[list[Any]], int]
    finish: Callable[[TrainState], Outcome]
    evaluate: Callable[[int], dict[str, float]] | None = None
    samples: Callable[[int], None] | None = None
    samples_every: int = 0            # steps between `samples` calls (the kind's samples: block)
    before_step: Callable[[int], None] | None = None
    row: Callable[[StepResult], dict[str, float]] | None = None
    chat_template: str | None = None  # saved with the tokenizer (post-training)
    postfix: str = ""                 # the progress bar's extra figure, a key of the log row
    records: Callable[[], list[Record]] | None = None
    sources: dict[str, Any] = field(default_factory=dict)  # data source name -> forge.data.sources.Source


class _Ranks:
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


class _Halt:
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
    row = {"loss": float(out.loss), "lr": out.lr, "tokens_per_s": tps, **meter.utilisation(tps),
           "tokens": state.tokens, **stats, **(task.row(out) if task.row is not None else {})}
    if out.grad_norm is not None:
        row["grad_norm"] = float(out.grad_norm)
    tracker.log_metrics(row, step=state.step)
    return row


def _due(s: Session, task: Task, step: int) -> bool:
    """Whether evaluation, samples or a checkpoint come after this step (each reads the model)."""
    cfg, last = s.settings, step == s.total_steps
    return bool((cfg.eval.every and step % cfg.eval.every == 0 and not last)
                or (task.samples is not None and task.samples_every and step % task.samples_every == 0)
                or (cfg.checkpoint.every and step % cfg.checkpoint.every == 0 and not last))


def _periodic(s: Session, task: Task, tracker: Tracker, state: TrainState, ctx: tuple[Meter, _Ranks, bool],
              guard: DivergenceGuard) -> None:
    """Evaluation, samples and a resume point at their cadences (throughput paused); then the stop."""
    meter, ranks, halt = ctx
    step, cfg, last = state.step, s.settings, state.step == s.total_steps
    with meter.paused():
        if cfg.eval.every and step % cfg.eval.every == 0 and not last:
            _evaluate(task, tracker, step)
        if task.samples is not None and task.samples_every and step % task.samples_every == 0:
            task.samples(step)
        if not last and (halt or (cfg.checkpoint.every and step % cfg.checkpoint.every == 0)):
            ranks.flush(state, meter, stats=False)
            guard.last_good_checkpoint = s.save_resumable(state)
    if halt and not last:
        raise StopRequested(cfg.name, step, guard.last_good_checkpoint)


def _traced_step(s: Session, task: Task, tracker: Tracker,
                 at: tuple[DivergenceGuard, int]) -> tuple[list[Any], StepResult]:
    """One step over the task's next batches; a step the guard skips or stops at has its message and
    the records of its batches logged to the run (guard/step-N.txt and a tag)."""
    guard, step = at
    batches = task.batches()
    guard.batch = list(dict.fromkeys(task.records())) if task.records is not None else []  # each record once
    try:
        out = train_step(s, batches, task.loss, guard, step)
    except Divergence as e:
        _log_trip(tracker, guard, step, str(e))
        raise
    if out.skipped is not None:
        if s.is_main:
            say(guard.note)
        _log_trip(tracker, guard, step, guard.note)
    return batches, out


def _settle(guard: DivergenceGuard, tracker: Tracker) -> None:
    """Judge the steps the guard watched since the last read point (it raises at a bad one)."""
    try:
        guard.settle()
    except Divergence as e:
        _log_trip(tracker, guard, guard.tripped_at, str(e))
        raise


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
    meter, ranks, loss = Meter(s.place.flops, s.world), _Ranks(s), math.nan
    bar = progress(s.total_steps, cfg.name, enabled=s.is_main)
    bar.update(state.step)
    with GracefulStop() as stop:
        halter = _Halt(s, stop, cfg.log_every)
        for step in range(state.step + 1, s.total_steps + 1):
            if task.before_step is not None:
                with meter.paused():
                    task.before_step(step)
            batches, out = _traced_step(s, task, tracker, (guard, step))
            state.step = step
            ranks.add(task.tokens(batches), out)
            meter.step()
            logged = step % cfg.log_every == 0 or step == s.total_steps
            due = logged or _due(s, task, step)
            halt = halter.check(step, due)
            if due or halt:  # what reads the model or its figures comes after the guard's verdict
                _settle(guard, tracker)
            if logged:
                row = _log(s, task, tracker, state, (meter, ranks, out))
                halter.pace(meter.step_seconds)
                loss = row["loss"]
                figure = {task.postfix: f"{row[task.postfix]:.3f}"} if task.postfix in row else {}
                if "mfu" in row:
                    figure["mfu"] = f"{row['mfu']:.1%}"
                bar.set_postfix(loss=f"{loss:.3f}", tok_s=f"{row['tokens_per_s']:,.0f}", **figure)
            _periodic(s, task, tracker, state, (meter, ranks, halt), guard)
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
