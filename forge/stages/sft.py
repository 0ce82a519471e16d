"""Supervised fine-tuning: masked next-token loss on chat records (assistant tokens by default).

Records become chat messages by their source's `chat:` mapping and are tokenized once with the
chat template (forge.data.formats); each epoch the training examples are shuffled and packed
best-fit into seq_len blocks whose position ids restart per example (forge.data.packing), or
padded per batch. An explicit loop over forge.train's blocks, like pretraining: held-out loss
first, every `eval.every` steps and at the end; sample generations every `samples.every` steps;
LoRA adapters when `lora:` is set. The chat template is saved with the model.
"""
from __future__ import annotations

import math

import torch

from forge.data.examples import sft_examples
from forge.data.formats import ChatEncoder, FormatStats, resolve_chat_template, to_messages
from forge.data.packing import collate, pack_best_fit, pad_batches
from forge.errors import ForgeError
from forge.recipe.settings import SftStage
from forge.stages.chat import chat_spec, generate, log_samples, lora_wrap, save_final, split_rows
from forge.stages.result import StageInputs, StageResult
from forge.train.checkpoint import split_state
from forge.train.losses import masked_lm_loss, masked_lm_loss_sum
from forge.train.meter import Meter
from forge.train.progress import progress
from forge.train.session import open_session
from forge.train.state import TrainState
from forge.train.step import DivergenceGuard, train_step
from forge.train.stop import GracefulStop, after_step


class SftStream:
    """Micro-batches over the examples, epoch after epoch (shuffled by seed and epoch): packed
    blocks or padded batches. Its position (epoch, unit) is part of the resume state."""

    def __init__(self, examples: list[dict], seq_len: int, batch_size: int, packing: str, pad_id: int, seed: int):
        self.examples, self.seq_len, self.batch_size = examples, seq_len, batch_size
        self.packing, self.pad_id, self.seed = packing, pad_id, seed
        self.epoch, self.pos, self.units = 0, 0, self._epoch_units(0)
        self.real_tokens = 0  # non-pad tokens handed out (this rank)

    def _epoch_units(self, epoch: int) -> list[dict]:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        order = torch.randperm(len(self.examples), generator=g).tolist()
        shuffled = [self.examples[i] for i in order]
        if self.packing == "pad":
            return shuffled
        blocks = pack_best_fit(shuffled, self.seq_len, self.pad_id)  # longest first: shuffle the blocks too
        return [blocks[i] for i in torch.randperm(len(blocks), generator=g).tolist()]

    def _take(self, n: int) -> list[dict]:
        out = []
        while len(out) < n:
            if self.pos >= len(self.units):
                self.epoch, self.pos = self.epoch + 1, 0
                self.units = self._epoch_units(self.epoch)
            k = min(n - len(out), len(self.units) - self.pos)
            out += self.units[self.pos:self.pos + k]
            self.pos += k
        return out

    def next_batch(self, rank: int = 0, world: int = 1) -> dict[str, torch.Tensor]:
        units = self._take(self.batch_size * world)[rank * self.batch_size:(rank + 1) * self.batch_size]
        if self.packing == "pad":
            self.real_tokens += sum(len(u["input_ids"]) for u in units)
            return pad_batches(units, len(units), self.pad_id)[0][0]
        self.real_tokens += sum(sum(u["lengths"]) for u in units)
        return collate(units)

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "pos": self.pos, "real_tokens": self.real_tokens}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.pos, self.real_tokens = state["epoch"], state["pos"], state["real_tokens"]
        self.units = self._epoch_units(self.epoch)


def load_examples(stage: SftStage, sources: dict, tokenizer, held_out: bool) -> tuple[list[dict], dict, str]:
    """(examples, counts per source, chat template) of the stage's sources, one split."""
    examples, counts, template = [], {}, None
    for name in stage.data:
        spec = chat_spec(sources[name], f"stage {stage.name}", stage.train_on)
        stats = FormatStats()
        examples += list(sft_examples(split_rows(sources[name], held_out), tokenizer, spec, stage.seq_len, name, stats,
                                      sources[name].on_error, sources[name].max_errors))
        counts[name] = stats
        if template is None:
            template = resolve_chat_template(tokenizer, spec)[0]
    return examples, counts, template


@torch.no_grad()
def heldout_sft_loss(model, batches: list[dict], device) -> float:
    """Mean loss per labelled token over held-out padded batches."""
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    for b in batches:
        s, n = masked_lm_loss_sum(model, {k: v.to(device) for k, v in b.items()})
        total, count = total + s.item(), count + int(n)
    model.train(was_training)
    return total / max(count, 1)


def run(stage: SftStage, inputs: StageInputs) -> StageResult:
    where = f"stage {stage.name}"
    wrap = lora_wrap(stage.lora, where) if stage.lora else None
    s = open_session(stage, inputs.checkpoint, inputs.out_dir, inputs.resume, wrap=wrap)
    tracker, tok = inputs.tracker, s.tokenizer
    train, counts, template = load_examples(stage, inputs.sources, tok, held_out=False)
    if not train:
        raise ForgeError(f"{where}: no training examples in {stage.data} (all held out, too long or unlabelled)")
    held, _, _ = load_examples(stage, inputs.sources, tok, held_out=True)
    tracker.log_summary("data", {k: v for n, st in counts.items() for k, v in st.as_dict(n).items()})  # single counts
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    data = SftStream(train, stage.seq_len, stage.batch_size, stage.packing, pad_id, stage.seed)
    held_batches = pad_batches(held[: stage.eval.max_blocks * stage.batch_size * s.world], stage.batch_size, pad_id)[0] if held else []
    guard = DivergenceGuard(stage.guard, where)
    state = TrainState(s.optimizer, s.scheduler, data, guard)
    encoder = ChatEncoder(tok, chat_spec(inputs.sources[stage.data[0]], where))
    sample_prompts = _sample_prompts(stage, inputs.sources, held)

    def evaluate(step: int) -> float:
        loss = heldout_sft_loss(s.model, held_batches, s.device)
        tracker.log_metrics({"eval_loss": loss, "eval_ppl": math.exp(min(loss, 50.0))}, step=step)
        return loss

    def samples(step: int) -> None:
        if sample_prompts and s.accelerator.is_main_process:
            outs = generate(s.accelerator.unwrap_model(s.model), tok, encoder, sample_prompts,
                            stage.samples.max_new_tokens, s.device)
            log_samples(tracker, step, sample_prompts, outs)

    if s.restore(state):
        tracker.set_tags({"resumed_from": str(s.resume_from)})
        guard.last_good_checkpoint = s.resume_from
    elif held_batches:
        state.metrics["eval_loss_start"] = evaluate(0)

    meter, loss = Meter(stage.tokens_per_step * s.world), float("nan")
    bar = progress(s.total_steps, stage.name, enabled=s.accelerator.is_main_process)
    bar.update(state.step)
    with GracefulStop() as stop:
        for step in range(state.step + 1, s.total_steps + 1):
            before = data.real_tokens
            batches = [data.next_batch(s.rank, s.world) for _ in range(stage.grad_accum)]
            out = train_step(s, batches, masked_lm_loss, guard, step)
            real = data.real_tokens - before
            if s.world > 1:  # the other ranks' batches hold other numbers of real tokens
                real = int(s.accelerator.reduce(torch.tensor(real, device=s.device), "sum").item())
            state.step, state.tokens, loss = step, state.tokens + real, out.loss
            meter.step(real)
            last = step == s.total_steps
            if step % stage.log_every == 0 or last:
                row = {"loss": out.loss, "lr": out.lr, "tokens_per_s": meter.window_tokens_per_s(),
                       "tokens": state.tokens, "target_tokens": out.targets, "epoch": data.epoch}
                if out.grad_norm is not None:
                    row["grad_norm"] = out.grad_norm
                tracker.log_metrics(row, step=step)
                bar.set_postfix(loss=f"{out.loss:.3f}", tok_s=f"{row['tokens_per_s']:,.0f}")
            after_step(s, stage, state, guard, stop, meter, step, evaluate if held_batches else None, samples)
            bar.update(1)
    bar.close()

    metrics = state.metrics
    metrics["loss"] = loss
    if held_batches:
        metrics["eval_loss"] = evaluate(s.total_steps)
    metrics.update({"tokens": state.tokens, "epochs": data.epoch + data.pos / max(1, len(data.units)),
                    "train_examples": len(train), "heldout_examples": len(held)})
    metrics.update(meter.totals())
    if stage.packing == "best_fit":
        blocks = data.units if data.units else [{"input_ids": [0] * stage.seq_len, "lengths": [0]}]
        metrics["packing_efficiency"] = sum(sum(b["lengths"]) for b in blocks) / (len(blocks) * stage.seq_len)
    metrics["peak_mem_bytes"] = s.memory.peak_bytes()
    share = {n: c.tokens for n, c in counts.items()}
    total = max(1, sum(share.values()))
    tokens_by_source = {n: round(state.tokens * v / total) for n, v in share.items()}
    lineage = {"format": {n: c.as_dict(f"data.{n}") for n, c in counts.items()}, "chat_template": template,
               "train_on": stage.train_on or "source", "packing": stage.packing,
               **({"lora": stage.lora.model_dump()} if stage.lora else {})}
    result = StageResult(inputs.out_dir / "final", metrics, s.total_steps, tokens_by_source, lineage)
    as_json, tensors = split_state(state.state_dict())
    save_final(s, result.checkpoint, {**as_json, "result": result.as_dict()},
               tensors if stage.checkpoint.final_optimizer else None, stage.lora, inputs.checkpoint, template)
    return result


def _sample_prompts(stage: SftStage, sources: dict, held: list[dict]) -> list[list[dict]]:
    """The first held-out conversations' prompts (messages up to the last user turn), for sample tables."""
    if not stage.samples.every:
        return []
    out = []
    for name in stage.data:
        spec = chat_spec(sources[name], f"stage {stage.name}")
        for _, where, row in split_rows(sources[name], held_out=True):
            try:
                msgs = to_messages(row, spec, where)
            except ForgeError:
                continue
            last_user = max((i for i, m in enumerate(msgs) if m["role"] == "user"), default=None)
            if last_user is not None:
                out.append(msgs[:last_user + 1])
            if len(out) >= stage.samples.prompts:
                return out
    return out
