"""Continued pretraining and mid-training: causal-LM loss over packed, mixed token blocks.

An explicit loop over forge.train's blocks: for each optimizer step, `grad_accum` micro-batches of
packed `seq_len` blocks drawn from the mixture by token share. Evaluation on held-out documents
runs first (the starting point), every `eval.every` steps and at the end; resumable checkpoints
every `checkpoint.every` steps and when a signal asks the run to stop. A midtrain stage may
extend the context (RoPE) and decays its learning rate (anneal or WSD) by default.
"""
from __future__ import annotations

from forge.data.mixing import build_mixture
from forge.eval.perplexity import loss_metrics, source_blocks, source_losses
from forge.recipe.settings import MidtrainStage, PretrainStage
from forge.stages.result import StageInputs, StageResult
from forge.train.checkpoint import split_state
from forge.train.context import extend_context
from forge.train.losses import causal_lm_loss
from forge.train.meter import Meter
from forge.train.progress import progress
from forge.train.session import open_session
from forge.train.state import TrainState
from forge.train.step import DivergenceGuard, train_step
from forge.train.stop import GracefulStop, after_step


def run(stage: PretrainStage, inputs: StageInputs) -> StageResult:
    ctx = stage.context if isinstance(stage, MidtrainStage) else None
    configure = (lambda cfg: extend_context(cfg, ctx, stage.context_length(), f"stage {stage.name}")) if ctx else None
    s = open_session(stage, inputs.checkpoint, inputs.out_dir, inputs.resume, configure, inputs.run_id)
    tracker = inputs.tracker
    mix = build_mixture(inputs.sources, stage.weights, s.tokenizer, stage.seq_len, stage.separator,
                        max_repeats=stage.max_repeats, on_exhausted=stage.on_exhausted)
    # each source's own held-out blocks: the mixed figure is their token-weighted mean
    held_out = source_blocks(inputs.sources, stage.weights, s.tokenizer, stage.seq_len, stage.separator,
                             stage.eval.max_blocks) or None
    guard = DivergenceGuard(stage.guard, f"stage {stage.name}")
    state = TrainState(s.optimizer, s.scheduler, mix, guard)

    def evaluate(step: int) -> dict[str, float]:
        row = loss_metrics(source_losses(s.model, held_out, stage.batch_size, s.device))
        tracker.log_metrics(row, step=step)
        return row

    if s.restore(state):
        tracker.set_tags({"resumed_from": str(s.resume_from)})
        guard.last_good_checkpoint = s.resume_from
    elif held_out is not None:
        start = evaluate(0)
        state.metrics["eval_loss_start"] = start["eval_loss"]
        state.metrics.update({f"{k}_start": v for k, v in start.items() if k.endswith(".loss")})

    tokens_per_step = stage.tokens_per_step * s.world
    meter, loss = Meter(tokens_per_step), float("nan")
    bar = progress(s.total_steps, stage.name, enabled=s.accelerator.is_main_process)
    bar.update(state.step)
    with GracefulStop() as stop:
        for step in range(state.step + 1, s.total_steps + 1):
            batches = [mix.next_batch(stage.batch_size, s.rank, s.world) for _ in range(stage.grad_accum)]
            out = train_step(s, batches, causal_lm_loss, guard, step)
            state.step, state.tokens, loss = step, state.tokens + tokens_per_step, out.loss
            meter.step()
            last = step == s.total_steps
            if step % stage.log_every == 0 or last:
                tps = meter.window_tokens_per_s()
                row = {"loss": out.loss, "lr": out.lr, "tokens_per_s": tps, "tokens": state.tokens,
                       **{f"tokens.{k}": v for k, v in mix.taken.items()},
                       **{f"repeats.{k}": v for k, v in mix.repeats().items()}}
                if out.grad_norm is not None:
                    row["grad_norm"] = out.grad_norm
                tracker.log_metrics(row, step=step)
                bar.set_postfix(loss=f"{out.loss:.3f}", tok_s=f"{tps:,.0f}")
            after_step(s, stage, state, guard, stop, meter, step, evaluate if held_out is not None else None)
            bar.update(1)
    bar.close()

    metrics = state.metrics
    metrics["loss"] = loss
    if held_out is not None:
        metrics.update(evaluate(s.total_steps))
    metrics["tokens"] = state.tokens
    metrics.update(meter.totals())
    # real tokens / block tokens: blocks are cut from the joined stream, so nothing is padding
    metrics["packing_efficiency"] = sum(mix.taken.values()) / max(1, s.total_steps * tokens_per_step)
    metrics["peak_mem_bytes"] = s.memory.peak_bytes()
    if guard.skipped:
        metrics["guard_skipped_steps"] = guard.skipped
    repeats = mix.repeats()
    if any(repeats.values()):
        tracker.set_tags({"repeats": ", ".join(f"{k}={v}" for k, v in repeats.items() if v)})
    if mix.rebalanced:
        tracker.set_tags({"rebalanced": ", ".join(mix.rebalanced)})
    lineage = {"repeats": repeats, "shares": mix.shares(), "rebalanced": list(mix.rebalanced)}
    if ctx:
        lineage["context"] = {"max_position": stage.context_length(), **ctx.model_dump(exclude_none=True)}
    result = StageResult(inputs.out_dir / "final", metrics, s.total_steps, dict(mix.taken), lineage)
    as_json, tensors = split_state(state.state_dict())
    s.save(result.checkpoint, {**as_json, "result": result.as_dict()},
           tensors if stage.checkpoint.final_optimizer else None)
    return result
