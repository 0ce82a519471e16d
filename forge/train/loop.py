"""The one training loop. `fit(session, task, tracker)` runs every training kind: it restores the
resume point, steps the optimizer over the task's micro-batches, logs at `log_every` (reducing
across ranks only then), stops gracefully on a signal, and writes the stage's final checkpoint and
metrics. Its side concerns are hooks (forge.train.hooks), called in this order: the divergence
guard's log, evaluation, samples and resume points.

A stage kind brings only what is its own, as a `Task` (forge.train.task): how its batches are made,
its loss (with its statistics), its evaluation, its samples and its final figures.
"""
from __future__ import annotations

from forge.data.sources import name_records
from forge.progress import Progress, progress
from forge.train.denormals import flush_denormals
from forge.train.hooks import Checkpoints, Evaluation, GuardLog, Hook, Run, Samples, Tracker
from forge.train.meter import Meter
from forge.train.ranks import Halt, Ranks
from forge.train.result import StageResult
from forge.train.session import Session
from forge.train.signals import GracefulStop, StopRequested
from forge.train.state import TrainState
from forge.train.step import B, DivergenceGuard, StepResult, train_step
from forge.train.task import Task


def fit(s: Session, task: Task[B], tracker: Tracker) -> StageResult:
    """Train the session's model on the task to `s.total_steps`; save `out_dir/final` and return
    the metrics (the kind's, the loop's: loss, tokens, throughput, memory, guard skips). On a CPU,
    denormal floats are flushed to zero meanwhile unless the stage sets `flush_denormals: false`."""
    with flush_denormals(s.settings.flush_denormals and s.device.type == "cpu"):
        return _fit(s, task, tracker)


def _fit(s: Session, task: Task[B], tracker: Tracker) -> StageResult:
    cfg = s.settings
    guard = DivergenceGuard(cfg.guard, f"stage {cfg.name}", lambda records: name_records(task.sources, records))
    state = TrainState(s.optimizer, s.scheduler, task.data, guard)
    run = Run(s, tracker, state, guard, Ranks(s), resumed=s.restore(state))
    hooks = [GuardLog(), Evaluation(task, cfg.eval.every), Samples(task), Checkpoints(cfg.checkpoint.every)]
    for hook in hooks:
        hook.start(run)
    run.meter = Meter(s.place.flops, s.world)  # training time from here: the start's evaluation is no step's
    bar = progress(s.total_steps, cfg.name, enabled=s.is_main)
    bar.update(state.step)
    with GracefulStop() as stop:
        try:
            _steps(run, task, hooks, (Halt(s, stop, cfg.log_every), bar))
        except Exception as e:
            for hook in hooks:
                hook.on_error(run, e)
            raise
    bar.close()
    return _finish(run, task, hooks)


def _steps(run: Run, task: Task[B], hooks: list[Hook], halt_bar: tuple[Halt, Progress]) -> None:
    """The steps to the stage's end; after each, the hooks (throughput paused), then a requested stop."""
    halter, bar = halt_bar
    s = run.session
    for step in range(run.state.step + 1, s.total_steps + 1):
        row = _step(run, task, hooks, halter, step)
        if row is not None:
            run.loss = row["loss"]
            figure = {task.postfix: f"{row[task.postfix]:.3f}"} if task.postfix in row else {}
            if "mfu" in row:
                figure["mfu"] = f"{row['mfu']:.1%}"
            bar.set_postfix(loss=f"{run.loss:.3f}", tok_s=f"{row['tokens_per_s']:,.0f}", **figure)
        with run.meter.paused():
            for hook in hooks:
                hook.post_step(run, step)
        if run.halt and not run.last(step):
            raise StopRequested(s.settings.name, step, run.guard.last_good_checkpoint)
        bar.update(1)


def _step(run: Run, task: Task[B], hooks: list[Hook], halter: Halt, step: int) -> dict[str, float] | None:
    """One optimizer step over the task's next batches. At a read point (a log step, a step after
    which a hook reads the model, a stop) the guard first judges the steps since the last one; at a
    log step the row is logged and returned."""
    s = run.session
    with run.meter.paused():
        task.before_step(step)
    batches = task.batches()
    run.guard.batch = list(dict.fromkeys(task.records()))  # each record once: named if the step trips
    out = train_step(s, batches, task.loss, run.guard, step)
    for hook in hooks:
        hook.after_update(run, step, out)
    run.state.step = step
    run.ranks.add(task.tokens(batches), out)
    run.meter.step()
    logged = step % s.settings.log_every == 0 or run.last(step)
    read = logged or any(hook.reads(run, step) for hook in hooks)
    run.halt = halter.check(step, read)
    if read or run.halt:  # what reads the model or its figures comes after the guard's verdict
        run.guard.settle()
    if not logged:
        return None
    row = _log(run, task, out)
    halter.pace(run.meter.step_seconds)
    return row


def _log(run: Run, task: Task[B], out: StepResult) -> dict[str, float]:
    """The step's log line: loss, rate, throughput, tokens, the kind's statistics over all ranks (one
    host read with the tokens) and its own figures."""
    state, meter = run.state, run.meter
    stats = run.ranks.flush(state, meter)
    tps = meter.window_tokens_per_s()
    row = {"loss": float(out.loss), "lr": out.lr, "tokens_per_s": tps, **meter.utilisation(tps),
           "tokens": state.tokens, **stats, **task.row(out)}
    if out.grad_norm is not None:
        row["grad_norm"] = float(out.grad_norm)
    run.tracker.log_metrics(row, step=state.step)
    return row


def _finish(run: Run, task: Task[B], hooks: list[Hook]) -> StageResult:
    s, state = run.session, run.state
    metrics = state.metrics
    metrics["loss"] = run.loss
    trained = run.meter.totals()  # training time only: the final evaluation is not a step's
    for hook in hooks:
        hook.end(run, metrics)
    metrics["tokens"] = state.tokens
    metrics.update(trained)
    metrics["peak_mem_bytes"] = s.memory.peak_bytes()
    if run.guard.skipped:
        metrics["guard_skipped_steps"] = run.guard.skipped
    outcome = task.finish(state)
    metrics.update(outcome.metrics)
    if outcome.tags:
        run.tracker.set_tags(outcome.tags)
    result = StageResult(s.final_dir, metrics, s.total_steps, outcome.tokens_by_source, outcome.lineage)
    s.save_final(state, result.as_dict(), task.chat_template)
    return result

