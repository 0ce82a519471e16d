"""Direct preference optimisation: raise the policy's log-ratio of chosen over rejected replies
against the reference, which is the stage's input checkpoint.

Pairs come from a preference source (`chat.kind: preference | hh`), tokenized with the chat
template, labels on the replies. With `reference: cached` (the default) the reference's summed
reply log-probs are computed once, before training, by a model that is then dropped, and kept
on disk (`reference_logps.pt`, keyed by checkpoint and data), so the reference never sits in
memory while the policy trains; `reference: live` keeps it and runs it every step. Held-out
pairs give reward margin and accuracy at the start and the end; every `samples.every` steps a sample
table (forge.stages.dpo_samples).
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch

from forge.data.examples import preference_examples
from forge.data.formats import FormatStats, resolve_chat_template
from forge.errors import ForgeError
from forge.recipe.settings import DpoStage
from forge.stages.chat import chat_spec, lora_wrap, mean_over_ranks, save_final, split_rows
from forge.stages.dpo_samples import log_dpo_samples
from forge.stages.result import StageInputs, StageResult
from forge.train.checkpoint import split_state
from forge.train.meter import Meter
from forge.train.preference import dpo_loss, sequence_logps
from forge.train.progress import progress
from forge.train.session import load_model, open_session
from forge.train.state import TrainState
from forge.train.step import DivergenceGuard, train_step
from forge.train.stop import GracefulStop, after_step

IGNORE = -100


def collate_pairs(pairs: list[dict], pad_id: int, ref: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """One right-padded batch: the chosen rows, then the rejected rows (and their reference log-probs)."""
    rows = [(p["chosen_input_ids"], p["chosen_labels"]) for p in pairs] + \
           [(p["rejected_input_ids"], p["rejected_labels"]) for p in pairs]
    width = max(len(ids) for ids, _ in rows)
    batch = {"input_ids": torch.tensor([ids + [pad_id] * (width - len(ids)) for ids, _ in rows]),
             "labels": torch.tensor([lab + [IGNORE] * (width - len(lab)) for _, lab in rows]),
             "attention_mask": torch.tensor([[1] * len(ids) + [0] * (width - len(ids)) for ids, _ in rows]),
             "targets": torch.tensor(len(pairs))}
    if ref is not None:
        batch["ref_logps"] = torch.cat([ref[:, 0], ref[:, 1]])
    return batch


class PairStream:
    """Batches of pair indices, epoch after epoch (shuffled by seed and epoch); resumable."""

    def __init__(self, n: int, batch_size: int, seed: int):
        self.n, self.batch_size, self.seed, self.epoch, self.pos = n, batch_size, seed, 0, 0
        self.order = self._order(0)

    def _order(self, epoch: int) -> list[int]:
        return torch.randperm(self.n, generator=torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)).tolist()

    def next_indices(self, rank: int = 0, world: int = 1) -> list[int]:
        out = []
        while len(out) < self.batch_size * world:
            if self.pos >= self.n:
                self.epoch, self.pos, self.order = self.epoch + 1, 0, self._order(self.epoch + 1)
            k = min(self.batch_size * world - len(out), self.n - self.pos)
            out += self.order[self.pos:self.pos + k]
            self.pos += k
        return out[rank * self.batch_size:(rank + 1) * self.batch_size]

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "pos": self.pos}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.pos = state["epoch"], state["pos"]
        self.order = self._order(self.epoch)


def load_pairs(stage: DpoStage, sources: dict, tokenizer, held_out: bool) -> tuple[list[dict], dict]:
    pairs, counts = [], {}
    for name in stage.data:
        spec = chat_spec(sources[name], f"stage {stage.name}")
        stats = FormatStats()
        pairs += list(preference_examples(split_rows(sources[name], held_out), tokenizer, spec, stage.seq_len,
                                          name, stats, sources[name].on_error, sources[name].max_errors))
        counts[name] = stats
    return pairs, counts


def pair_logps(model, batch: dict, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(summed reply log-probs, reply tokens), each (pairs, 2): column 0 chosen, column 1 rejected."""
    logps, tokens = sequence_logps(model, batch["input_ids"].to(device), batch["attention_mask"].to(device),
                                   batch["labels"].to(device))
    return torch.stack(logps.chunk(2), dim=1), torch.stack(tokens.chunk(2), dim=1)


@torch.no_grad()
def reference_logps(model, pairs: list[dict], batch_size: int, pad_id: int, device) -> torch.Tensor:
    model.eval()
    out = [pair_logps(model, collate_pairs(pairs[i:i + batch_size], pad_id), device)[0].float().cpu()
           for i in range(0, len(pairs), batch_size)]
    return torch.cat(out) if out else torch.zeros(0, 2)


def cached_reference(stage: DpoStage, checkpoint: Path, splits: dict[str, list[dict]], pad_id: int, out_dir: Path,
                     device) -> dict[str, torch.Tensor]:
    """The reference's log-probs of every split, from `out_dir/reference_logps.pt` when it matches
    the checkpoint and data, else computed by a reference model that is dropped afterwards."""
    h = hashlib.sha256(str(Path(checkpoint).resolve()).encode())
    for name in sorted(splits):
        h.update(name.encode() + json.dumps([[p["chosen_input_ids"], p["rejected_input_ids"]] for p in splits[name]]).encode())
    key, path = h.hexdigest(), Path(out_dir) / "reference_logps.pt"
    if path.is_file():
        saved = torch.load(path, weights_only=True)
        if saved.get("key") == key:
            return saved["logps"]
    model, _ = load_model(checkpoint)
    model.to(device)
    logps = {name: reference_logps(model, pairs, stage.batch_size, pad_id, device) for name, pairs in splits.items()}
    del model
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save({"key": key, "logps": logps}, tmp)
    tmp.replace(path)
    return logps


def run(stage: DpoStage, inputs: StageInputs) -> StageResult:
    where = f"stage {stage.name}"
    wrap = lora_wrap(stage.lora, where) if stage.lora else None
    s = open_session(stage, inputs.checkpoint, inputs.out_dir, inputs.resume, wrap=wrap)
    tracker, tok = inputs.tracker, s.tokenizer
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    train, counts = load_pairs(stage, inputs.sources, tok, held_out=False)
    held, _ = load_pairs(stage, inputs.sources, tok, held_out=True)
    held = held[: stage.eval.max_blocks * stage.batch_size * s.world]  # the same pairs whatever the launch
    if not train:
        raise ForgeError(f"{where}: no preference pairs to train on in {stage.data} (all held out, too long or unlabelled)")
    tracker.log_summary("data", {k: v for n, st in counts.items() for k, v in st.as_dict(n).items()})  # single counts
    live = None
    if stage.reference == "cached":
        with s.accelerator.main_process_first():
            ref = cached_reference(stage, inputs.checkpoint, {"train": train, "held": held}, pad_id, inputs.out_dir,
                                   s.device)
    else:
        live, _ = load_model(inputs.checkpoint)
        live.to(s.device).eval().requires_grad_(False)
        ref = None
    stats: list[dict] = []

    def loss_fn(model, batch):
        policy, tokens = pair_logps(model, batch, s.device)
        if live is not None:
            with torch.no_grad():
                reference = pair_logps(live, batch, s.device)[0]
        else:
            reference = torch.stack(batch["ref_logps"].chunk(2), dim=1)
        out = dpo_loss(policy[:, 0], policy[:, 1], reference[:, 0], reference[:, 1], stage.beta, stage.label_smoothing,
                       stage.loss, tokens[:, 0], tokens[:, 1])
        stats.append(out.stats())
        return out.loss

    def batch_of(pairs: list[dict], idx: list[int], split: str) -> dict:
        return collate_pairs([pairs[i] for i in idx], pad_id, ref[split][idx] if ref is not None else None)

    @torch.no_grad()
    def evaluate(step: int) -> dict[str, float]:
        was = s.model.training
        s.model.eval()
        starts = range(0, len(held), stage.batch_size)
        rows = [loss_fn(s.model, batch_of(held, list(range(i, min(i + stage.batch_size, len(held)))), "held"))
                for i in starts]
        s.model.train(was)
        sizes = [min(stage.batch_size, len(held) - i) for i in starts]  # per-pair means, a short last batch too
        got = {f"eval_{k}": sum(x[k] * n for x, n in zip(stats[-len(rows):], sizes)) / len(held) for k in stats[-1]}
        got["eval_loss"] = sum(float(r) * n for r, n in zip(rows, sizes)) / len(held)
        del stats[-len(rows):]
        tracker.log_metrics(got, step=step)
        return got

    def samples(step: int) -> None:
        if s.accelerator.is_main_process:
            log_dpo_samples(tracker, step, stage, s.accelerator.unwrap_model(s.model), tok, held, train, ref,
                            live, pad_id, s.device)

    data = PairStream(len(train), stage.batch_size, stage.seed)
    guard = DivergenceGuard(stage.guard, where)
    state = TrainState(s.optimizer, s.scheduler, data, guard)
    if s.restore(state):
        tracker.set_tags({"resumed_from": str(s.resume_from)})
        guard.last_good_checkpoint = s.resume_from
    elif held:
        state.metrics.update({f"{k}_start": v for k, v in evaluate(0).items()})

    meter, loss = Meter(stage.tokens_per_step * s.world), float("nan")
    bar = progress(s.total_steps, stage.name, enabled=s.accelerator.is_main_process)
    bar.update(state.step)
    with GracefulStop() as stop:
        for step in range(state.step + 1, s.total_steps + 1):
            batches = [batch_of(train, data.next_indices(s.rank, s.world), "train") for _ in range(stage.grad_accum)]
            stats.clear()
            out = train_step(s, batches, loss_fn, guard, step)
            real = sum(int(b["attention_mask"].sum()) for b in batches)
            if s.world > 1:  # the other ranks' pairs hold other numbers of tokens
                real = int(s.accelerator.reduce(torch.tensor(real, device=s.device), "sum").item())
            state.step, state.tokens, loss = step, state.tokens + real, out.loss
            meter.step(real)
            last = step == s.total_steps
            if step % stage.log_every == 0 or last:
                row = {"loss": out.loss, "lr": out.lr, "tokens_per_s": meter.window_tokens_per_s(),
                       **mean_over_ranks(s.accelerator, {k: sum(x[k] for x in stats) / len(stats) for k in stats[0]})}
                if out.grad_norm is not None:
                    row["grad_norm"] = out.grad_norm
                tracker.log_metrics(row, step=step)
                bar.set_postfix(loss=f"{out.loss:.3f}", tok_s=f"{row['tokens_per_s']:,.0f}")
            after_step(s, stage, state, guard, stop, meter, step, evaluate if held else None, samples)
            bar.update(1)
    bar.close()

    metrics = state.metrics
    metrics["loss"] = loss
    if held:
        metrics.update(evaluate(s.total_steps))
    metrics.update({"tokens": state.tokens, "train_pairs": len(train), "heldout_pairs": len(held),
                    "epochs": data.epoch + data.pos / len(train)})
    metrics.update(meter.totals())
    metrics["peak_mem_bytes"] = s.memory.peak_bytes()
    share = {n: c.tokens for n, c in counts.items()}
    tokens_by_source = {n: round(state.tokens * v / max(1, sum(share.values()))) for n, v in share.items()}
    lineage = {"format": {n: c.as_dict(f"data.{n}") for n, c in counts.items()}, "reference": str(inputs.checkpoint),
               "reference_mode": stage.reference, **({"lora": stage.lora.model_dump()} if stage.lora else {})}
    result = StageResult(inputs.out_dir / "final", metrics, s.total_steps, tokens_by_source, lineage)
    as_json, tensors = split_state(state.state_dict())
    template = resolve_chat_template(tok, chat_spec(inputs.sources[stage.data[0]], where))[0]
    save_final(s, result.checkpoint, {**as_json, "result": result.as_dict()},
               tensors if stage.checkpoint.final_optimizer else None, stage.lora, inputs.checkpoint, template)
    return result
