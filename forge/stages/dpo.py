"""Direct preference optimisation: raise the policy's log-ratio of chosen over rejected replies
against the reference, which is the stage's input checkpoint.

Pairs come from a preference source (`chat.kind: preference | hh`), tokenized with the chat
template, labels on the replies. With `reference: cached` (the default) the reference's summed
reply log-probs are computed once, before training, by a model that is then dropped, and kept
on disk (`reference_logps.pt`, keyed by checkpoint and data), so the reference never sits in
memory while the policy trains; `reference: live` keeps it and runs it every step. Its own part
of the loop (forge.train.loop.fit): pair batches, the preference loss with reward statistics,
held-out reward margin and accuracy as the evaluation, and a sample table (forge.stages.samples).
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import torch

from forge.data.examples import OnError, preference_examples
from forge.data.formats import FormatStats, resolve_chat_template
from forge.errors import ForgeError
from forge.progress import counted, say
from forge.recipe.settings import DpoStage
from forge.stages.post_data import chat_spec, epoch_generator, split_rows, tokens_by_source
from forge.stages.result import StageInputs, StageResult
from forge.stages.samples import log_dpo_samples
from forge.track.protocol import StageTracker
from forge.train.loop import fit
from forge.train.losses import IGNORE, Loss
from forge.train.preference import dpo_loss, sequence_logps
from forge.train.session import Session, open_session
from forge.train.state import TrainState
from forge.train.task import Outcome, Task

Pair = dict[str, Any]  # a tokenized preference pair (forge.data.examples.preference_examples)


def collate_pairs(pairs: list[Pair], pad_id: int, ref: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
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
        self.handed: list[int] = []  # the pairs handed out (this rank) since take_handed

    def _order(self, epoch: int) -> list[int]:
        return torch.randperm(self.n, generator=epoch_generator(self.seed, epoch)).tolist()

    def next_indices(self, rank: int = 0, world: int = 1) -> list[int]:
        out: list[int] = []
        while len(out) < self.batch_size * world:
            if self.pos >= self.n:
                self.epoch, self.pos, self.order = self.epoch + 1, 0, self._order(self.epoch + 1)
            k = min(self.batch_size * world - len(out), self.n - self.pos)
            out += self.order[self.pos:self.pos + k]
            self.pos += k
        mine = out[rank * self.batch_size:(rank + 1) * self.batch_size]
        self.handed += mine
        return mine

    def take_handed(self) -> list[int]:
        out, self.handed = self.handed, []
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "pos": self.pos}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch, self.pos = state["epoch"], state["pos"]
        self.order = self._order(self.epoch)


def load_pairs(stage: DpoStage, sources: dict[str, Any], tokenizer: Any,
               held_out: bool) -> tuple[list[Pair], dict[str, FormatStats]]:
    pairs: list[Pair] = []
    counts: dict[str, FormatStats] = {}
    for name in stage.data:
        spec = chat_spec(sources[name], f"stage {stage.name}")
        stats = FormatStats()
        made = preference_examples(split_rows(sources[name], held_out), tokenizer, spec, stage.seq_len,
                                   name, stats, OnError(sources[name].on_error, sources[name].max_errors))
        pairs += [{**p, "record": (name, n)} for p, n in zip(list(made), stats.kept)]  # to name a bad batch's pairs
        counts[name] = stats
    return pairs, counts


def pair_logps(model: torch.nn.Module, batch: dict[str, torch.Tensor],
               device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(summed reply log-probs, reply tokens), each (pairs, 2): column 0 chosen, column 1 rejected."""
    logps, tokens = sequence_logps(model, batch["input_ids"].to(device), batch["attention_mask"].to(device),
                                   batch["labels"].to(device))
    return torch.stack(logps.chunk(2), dim=1), torch.stack(tokens.chunk(2), dim=1)


@torch.no_grad()
def reference_logps(model: torch.nn.Module, pairs: list[Pair], batch_size: int, pad_id: int,
                    device: torch.device, desc: str | None = None) -> torch.Tensor:
    """The summed reply log-probs of every pair, batch by batch; with `desc`, a progress line
    (`desc: batch 12/40 (30%), ETA ...`) every ~10% of the batches or 10 s."""
    model.eval()
    starts = range(0, len(pairs), batch_size)
    out = [pair_logps(model, collate_pairs(pairs[i:i + batch_size], pad_id), device)[0].float().cpu()
           for i in counted(starts, len(starts), desc or "", "batch", enabled=desc is not None)]
    return torch.cat(out) if out else torch.zeros(0, 2)


def cached_reference(stage: DpoStage, s: Session, splits: dict[str, list[Pair]],
                     out_dir: Path) -> dict[str, torch.Tensor]:
    """The reference's log-probs of every split, from `out_dir/reference_logps.pt` when it matches
    the checkpoint and data, else computed by a reference model that is dropped afterwards."""
    checkpoint = s.place.checkpoint
    h = hashlib.sha256(str(Path(checkpoint).resolve()).encode())
    for name in sorted(splits):
        h.update(name.encode() + json.dumps([[p["chosen_input_ids"], p["rejected_input_ids"]] for p in splits[name]]).encode())
    key, path = h.hexdigest(), Path(out_dir) / "reference_logps.pt"
    if path.is_file():
        saved = torch.load(path, weights_only=True)
        if saved.get("key") == key:
            cached: dict[str, torch.Tensor] = saved["logps"]
            return cached
    if s.is_main:
        say(f"{stage.name}: the reference's log-probs of {sum(map(len, splits.values()))} pairs, computed once "
            f"before training (kept in {path})")
    model, _ = s.checkpoints.load_model(checkpoint)
    model.to(s.device)
    logps = {name: reference_logps(model, pairs, stage.batch_size, s.pad_id, s.device,
                                   f"{stage.name}: reference log-probs, {name} pairs" if s.is_main else None)
             for name, pairs in splits.items()}
    del model
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save({"key": key, "logps": logps}, tmp)
    tmp.replace(path)
    return logps


class Reference:
    """The reference's reply log-probs: cached per split (computed once, before training) or from a
    live copy of the input checkpoint, run on every batch."""

    def __init__(self, stage: DpoStage, s: Session, splits: dict[str, list[Pair]]):
        self.s, self.splits = s, splits
        self.cached: dict[str, torch.Tensor] | None = None
        self.live: Any = None  # the reference model (reference: live)
        if stage.reference == "cached":
            with s.accelerator.main_process_first():
                self.cached = cached_reference(stage, s, splits, s.place.out_dir)
        else:
            self.live = s.frozen_input()

    def batch(self, split: str, idx: list[int]) -> dict[str, torch.Tensor]:
        """The pairs `idx` of a split, collated, with their cached reference log-probs."""
        pairs = [self.splits[split][i] for i in idx]
        return collate_pairs(pairs, self.s.pad_id, self.cached[split][idx] if self.cached is not None else None)

    def logps(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        if self.live is None:
            return torch.stack(batch["ref_logps"].chunk(2), dim=1)
        with torch.no_grad():
            return pair_logps(self.live, batch, self.s.device)[0]


def preference_loss(stage: DpoStage, reference: Reference, model: torch.nn.Module,
                    batch: dict[str, torch.Tensor]) -> Loss:
    policy, tokens = pair_logps(model, batch, reference.s.device)
    out = dpo_loss(policy, reference.logps(batch), stage.beta, stage.label_smoothing, stage.loss, tokens)
    return Loss(out.loss, out.stats())


@torch.no_grad()
def heldout_figures(stage: DpoStage, reference: Reference, model: torch.nn.Module) -> dict[str, float]:
    """Loss and reward statistics over the held-out pairs (per-pair means, a short last batch too)."""
    was, n = model.training, len(reference.splits["held"])
    model.eval()
    sums: dict[str, float] = {}
    for i in range(0, n, stage.batch_size):
        idx = list(range(i, min(i + stage.batch_size, n)))
        out = preference_loss(stage, reference, model, reference.batch("held", idx))
        for k, v in {"loss": out.value, **out.stats}.items():
            sums[k] = sums.get(k, 0.0) + float(v) * len(idx)
    model.train(was)
    return {f"eval_{k}": v / n for k, v in sums.items()}


def run(stage: DpoStage, inputs: StageInputs) -> StageResult:
    where = f"stage {stage.name}"
    s = open_session(stage, inputs, lora=stage.lora)
    tracker, tok = inputs.tracker, s.tokenizer
    train, counts = load_pairs(stage, inputs.sources, tok, held_out=False)
    held, _ = load_pairs(stage, inputs.sources, tok, held_out=True)
    held = held[: stage.eval.max_blocks * stage.batch_size * s.world]  # the same pairs whatever the launch
    if not train:
        raise ForgeError(f"{where}: no preference pairs to train on in {stage.data} (all held out, too long or unlabelled)")
    tracker.log_summary("data", {k: v for n, st in counts.items() for k, v in st.as_dict(n).items()})  # single counts
    reference = Reference(stage, s, {"train": train, "held": held})
    template = resolve_chat_template(tok, chat_spec(inputs.sources[stage.data[0]], where))[0]
    return fit(s, DpoTask(stage, s, inputs, reference, (counts, template)), tracker)


class DpoTask(Task[dict[str, torch.Tensor]]):
    """DPO's part of the loop: batches of pairs with the reference's log-probs, the preference loss
    with reward statistics, held-out reward margin and accuracy, and a sample table."""

    def __init__(self, stage: DpoStage, s: Session, inputs: StageInputs, reference: Reference,
                 found: tuple[dict[str, FormatStats], str | None]):
        self.pairs = PairStream(len(reference.splits["train"]), stage.batch_size, stage.seed)
        super().__init__(self.pairs, inputs.sources)
        self.stage, self.s, self.inputs, self.reference = stage, s, inputs, reference
        self.counts, self.chat_template = found
        self.evaluates, self.samples_every = bool(reference.splits["held"]), stage.samples.every

    def batches(self) -> list[dict[str, torch.Tensor]]:
        return [self.reference.batch("train", self.pairs.next_indices(self.s.rank, self.s.world))
                for _ in range(self.stage.grad_accum)]

    def loss(self, model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor | Loss:
        return preference_loss(self.stage, self.reference, model, batch)

    def tokens(self, batches: list[dict[str, torch.Tensor]]) -> int:
        return sum(int(b["attention_mask"].sum()) for b in batches)

    def records(self) -> list[tuple[str, int]]:
        return [self.reference.splits["train"][i]["record"] for i in self.pairs.take_handed()]

    def evaluate(self, step: int) -> dict[str, float]:
        return heldout_figures(self.stage, self.reference, self.s.model)

    def samples(self, step: int) -> None:
        if self.s.is_main or self.s.sharded:  # sharded weights: every rank takes part, rank 0 logs
            _samples(self.stage, self.reference, self.s, self.inputs.tracker, step)

    def finish(self, state: TrainState) -> Outcome:
        splits = self.reference.splits
        return _outcome(self.stage, self.counts, state.tokens, self.pairs, (len(splits["train"]), len(splits["held"])),
                        self.inputs.checkpoint)


@torch.no_grad()
def _samples(stage: DpoStage, reference: Reference, s: Session, tracker: StageTracker, step: int) -> None:
    """The sample table of the first held-out pairs (training pairs when none are held out)."""
    split = "held" if reference.splits["held"] else "train"
    idx = list(range(min(stage.samples.prompts, len(reference.splits[split]))))
    if not idx:
        return
    model = s.unwrapped()
    was = model.training
    model.eval()
    batch = reference.batch(split, idx)
    rewards = stage.beta * (pair_logps(model, batch, s.device)[0].float().cpu() - reference.logps(batch).float().cpu())
    model.train(was)
    log_dpo_samples(tracker, step, model, s.tokenizer, [reference.splits[split][i] for i in idx], rewards,
                    stage.samples.max_new_tokens)


def _outcome(stage: DpoStage, counts: dict[str, FormatStats], tokens: int, data: PairStream, sizes: tuple[int, int],
             reference: Path) -> Outcome:
    lineage = {"format": {n: c.as_dict(f"data.{n}") for n, c in counts.items()}, "reference": str(reference),
               "reference_mode": stage.reference, **({"lora": stage.lora.model_dump()} if stage.lora else {})}
    metrics = {"train_pairs": sizes[0], "heldout_pairs": sizes[1], "epochs": data.epoch + data.pos / sizes[0]}
    return Outcome(metrics, tokens_by_source(counts, tokens), lineage)
