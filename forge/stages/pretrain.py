"""Continued pretraining and mid-training: causal-LM loss over packed, mixed token blocks.

One explicit loop on `accelerate`: for each optimizer step, `grad_accum` micro-batches of packed
`seq_len` blocks, backward, clip, step. Evaluation on held-out documents runs before training
(the starting point) and every `eval.every` steps; checkpoints are Hugging Face folders. The stage
neither knows nor cares which stage came before it: it takes a checkpoint and returns one.
"""
from __future__ import annotations

import contextlib
import math
import time
from pathlib import Path

import torch

from forge.data.mixing import build_mixture, eval_blocks
from forge.data.sources import Source
from forge.errors import ForgeError
from forge.recipe import PretrainStage
from forge.stages.result import StageResult
from forge.track import Tracker
from forge.train.accel import new_accelerator
from forge.train.checkpoint import latest_checkpoint, restore_training_state, save_checkpoint, training_state
from forge.train.memory import PeakMemory
from forge.train.optim import build_optimizer, build_scheduler
from forge.train.progress import progress

def _load(input_ckpt: Path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(input_ckpt)
        model = AutoModelForCausalLM.from_pretrained(input_ckpt, dtype=torch.float32, use_safetensors=True)
    except (OSError, ValueError) as e:
        raise ForgeError(f"cannot load checkpoint {input_ckpt}: {e}") from None
    return model, tokenizer


@torch.no_grad()
def evaluate(model, blocks: torch.Tensor, batch_size: int, device) -> float:
    """Mean next-token loss over held-out blocks (every predicted token weighted equally)."""
    model.eval()
    total, count = 0.0, 0
    for i in range(0, len(blocks), batch_size):
        x = blocks[i:i + batch_size].to(device)
        loss = model(input_ids=x, labels=x).loss
        n = x.shape[0] * (x.shape[1] - 1)
        total, count = total + loss.item() * n, count + n
    model.train()
    return total / count


def run(stage: PretrainStage, input_ckpt: Path, sources: dict[str, Source], out_dir: Path,
        tracker: Tracker, resume: bool = False) -> StageResult:
    """Train `input_ckpt` on the stage's mixture; return the final checkpoint and metrics.

    `resume`: continue from the newest checkpoint in `out_dir/checkpoints` (weights, optimizer,
    schedule, RNG and data position), so the result equals that of an uninterrupted run."""
    from accelerate.utils import set_seed

    accelerator = new_accelerator(stage.precision, f"stage {stage.name}")
    set_seed(stage.seed)
    memory = PeakMemory(accelerator.device)
    resume_from = latest_checkpoint(out_dir / "checkpoints") if resume else None
    model, tokenizer = _load(resume_from or input_ckpt)
    max_pos = getattr(model.config, "max_position_embeddings", None)
    if max_pos and stage.seq_len > max_pos:
        raise ForgeError(f"stage {stage.name}: seq_len {stage.seq_len} exceeds the model's context ({max_pos})")

    weights = stage.weights
    mix = build_mixture(sources, weights, tokenizer, stage.seq_len, stage.separator,
                        max_repeats=stage.max_repeats, on_exhausted=stage.on_exhausted)
    held_out = eval_blocks(sources, weights, tokenizer, stage.seq_len, stage.separator, stage.eval.max_blocks)
    world, rank = accelerator.num_processes, accelerator.process_index
    total_steps = stage.total_steps(world)

    optimizer = build_optimizer(model, stage.optim)
    scheduler = build_scheduler(optimizer, total_steps, stage.schedule)
    # the scheduler stays unprepared: accelerate would step it once per process each step, while
    # total_steps already counts optimizer steps of the whole data-parallel world
    model, optimizer = accelerator.prepare(model, optimizer)
    model.train()

    metrics: dict[str, float] = {}
    first_step = 1
    if resume_from is not None:
        saved = restore_training_state(resume_from, optimizer, scheduler)
        mix.load_state_dict(saved["data"])
        metrics.update(saved["metrics"])
        first_step = saved["step"] + 1
        tracker.set_tags({"resumed_from": str(resume_from)})
    elif held_out is not None:
        metrics["eval_loss_start"] = evaluate(model, held_out, stage.batch_size, accelerator.device)
        tracker.log_metrics({"eval_loss": metrics["eval_loss_start"],
                             "eval_ppl": math.exp(metrics["eval_loss_start"])}, step=0)

    tokens_per_step = stage.tokens_per_step * world
    bar = progress(total_steps, stage.name, enabled=accelerator.is_main_process)
    bar.update(first_step - 1)
    started, window_start, window_tokens = time.perf_counter(), time.perf_counter(), 0
    side_seconds = 0.0  # periodic evaluation and checkpoints: not part of a training step
    loss_value = float("nan")
    for step in range(first_step, total_steps + 1):
        step_loss = torch.zeros((), device=accelerator.device)
        for micro in range(stage.grad_accum):
            x = mix.next_batch(stage.batch_size, rank, world).to(accelerator.device)
            sync = micro == stage.grad_accum - 1
            with (contextlib.nullcontext() if sync else accelerator.no_sync(model)):
                with accelerator.autocast():
                    loss = model(input_ids=x, labels=x).loss / stage.grad_accum
                accelerator.backward(loss)
            step_loss += loss.detach()
        loss_value = accelerator.reduce(step_loss, "mean").item()  # every rank sees the same value
        if not math.isfinite(loss_value):
            raise ForgeError(f"stage {stage.name}: loss became {loss_value} at step {step}; "
                             "lower optim.lr or use precision fp32")
        grad_norm = (accelerator.clip_grad_norm_(model.parameters(), stage.optim.grad_clip)
                     if stage.optim.grad_clip else None)
        lr = scheduler.get_last_lr()[0]  # the rate this step used
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)

        window_tokens += tokens_per_step
        if step % stage.log_every == 0 or step == total_steps:
            now = time.perf_counter()
            tps = window_tokens / max(now - window_start, 1e-9)
            window_start, window_tokens = now, 0
            row = {"loss": loss_value, "lr": lr, "tokens_per_s": tps,
                   "tokens": step * tokens_per_step}
            if grad_norm is not None:
                row["grad_norm"] = float(grad_norm)
            row.update({f"tokens.{k}": v for k, v in mix.taken.items()})
            row.update({f"repeats.{k}": v for k, v in mix.repeats().items()})
            tracker.log_metrics(row, step=step)
            bar.set_postfix(loss=f"{loss_value:.3f}", tok_s=f"{tps:,.0f}")
        side_start = time.perf_counter()
        if held_out is not None and stage.eval.every and step % stage.eval.every == 0 and step != total_steps:
            ev = evaluate(model, held_out, stage.batch_size, accelerator.device)
            tracker.log_metrics({"eval_loss": ev, "eval_ppl": math.exp(ev)}, step=step)
        if stage.checkpoint.every and step % stage.checkpoint.every == 0 and step != total_steps:
            _save(accelerator, model, tokenizer, out_dir / "checkpoints" / f"step-{step:07d}",
                  {"step": step, "data": mix.state_dict(), "metrics": metrics},
                  training_state(optimizer, scheduler))
        side_seconds += time.perf_counter() - side_start
        window_start += time.perf_counter() - side_start  # tokens/s counts training time only
        bar.update(1)
    bar.close()
    elapsed = time.perf_counter() - started

    metrics["loss"] = loss_value
    if held_out is not None:
        metrics["eval_loss"] = evaluate(model, held_out, stage.batch_size, accelerator.device)
        tracker.log_metrics({"eval_loss": metrics["eval_loss"], "eval_ppl": math.exp(metrics["eval_loss"])},
                            step=total_steps)
    metrics["tokens"] = total_steps * tokens_per_step
    steps_run = max(1, total_steps - first_step + 1)
    metrics["train_seconds"] = elapsed - side_seconds
    metrics["tokens_per_s_mean"] = steps_run * tokens_per_step / max(metrics["train_seconds"], 1e-9)
    metrics["step_time_s"] = metrics["train_seconds"] / steps_run
    metrics["eval_checkpoint_seconds"] = side_seconds
    # real tokens / block tokens: blocks are cut from the joined stream, so nothing is padding
    metrics["packing_efficiency"] = sum(mix.taken.values()) / (total_steps * stage.tokens_per_step * world)
    metrics["peak_mem_bytes"] = memory.peak_bytes()
    repeats = mix.repeats()
    if any(repeats.values()):
        tracker.set_tags({"repeats": ", ".join(f"{k}={v}" for k, v in repeats.items() if v)})
    if mix.rebalanced:
        tracker.set_tags({"rebalanced": ", ".join(mix.rebalanced)})
    extra = {"shares": mix.shares(), "rebalanced": list(mix.rebalanced)}
    result = StageResult(out_dir / "final", metrics, dict(mix.taken), repeats, total_steps, extra)
    _save(accelerator, model, tokenizer, result.checkpoint,
          {"step": total_steps, "data": mix.state_dict(), "result": result.as_dict()})
    return result


def _save(accelerator, model, tokenizer, path: Path, state: dict, training: dict | None = None) -> Path:
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        save_checkpoint(accelerator.unwrap_model(model), tokenizer, path, state=state, training=training)
    accelerator.wait_for_everyone()
    return path
