"""Supervised fine-tuning: masked next-token loss on chat records (assistant tokens by default), with
plain-text sources among them replayed as language modelling (forge.stages.replay).

Records become chat messages by their source's `chat:` mapping and are tokenized once with the
chat template (forge.data.formats); each epoch the training examples are shuffled and packed
best-fit into seq_len blocks whose position ids restart per example (forge.data.packing; with
`replay_distill`, the replayed text into blocks of its own, spread evenly over the epoch), or padded
per batch. Its own part of the loop (forge.train.loop.fit): those batches, the masked loss,
held-out loss as the evaluation, sample generations of held-out prompts. LoRA adapters when
`lora:` is set. With `replay_distill`, the replayed general text's loss is (in that share) the KL
divergence from a frozen teacher: the stage's input model, or the pipeline's base
(`replay_teacher`); a proprietary text source (documents to learn) keeps the plain loss. The chat
template is saved with the model.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Callable

import torch

from forge.data.examples import OnError, sft_examples
from forge.data.formats import ChatEncoder, FormatStats, resolve_chat_template, to_messages
from forge.data.packing import collate, pack_best_fit, pad_batches
from forge.errors import ForgeError
from forge.lm.generation import Sampling, generate
from forge.recipe.settings import SftStage
from forge.stages.post_data import chat_spec, epoch_generator, split_rows, tokens_by_source
from forge.stages.replay import text_examples
from forge.stages.result import StageInputs, StageResult
from forge.stages.samples import log_samples
from forge.train.loop import fit
from forge.train.losses import Loss, distilled_lm_loss_sum, masked_lm_loss, masked_lm_loss_sum
from forge.train.session import Session, open_session
from forge.train.state import TrainState
from forge.train.step import StepResult
from forge.train.task import Outcome, Task


class SftStream:
    """Micro-batches over the examples, epoch after epoch (shuffled by seed and epoch): packed
    blocks or padded batches. Its position (epoch, unit) is part of the resume state."""

    def __init__(self, examples: list[dict[str, Any]], seq_len: int, batch_size: int, packing: str, pad_id: int,
                 seed: int):
        self.examples, self.seq_len, self.batch_size = examples, seq_len, batch_size
        self.packing, self.pad_id, self.seed = packing, pad_id, seed
        self.epoch, self.pos, self.units = 0, 0, self._epoch_units(0)
        self.real_tokens = 0  # non-pad tokens handed out (this rank)
        self._counted = 0
        self.handed: list[tuple[str, int]] = []  # (source, record number) handed out (this rank) since take_records

    def _epoch_units(self, epoch: int) -> list[dict[str, Any]]:
        g = epoch_generator(self.seed, epoch)
        order = torch.randperm(len(self.examples), generator=g).tolist()
        shuffled = [self.examples[i] for i in order]
        if self.packing == "pad":
            return shuffled
        # distilled replay packs apart from the rest, so that the teacher reads only the blocks that hold
        # it; each part's blocks (longest first: shuffled) are spread evenly over the epoch
        groups = [[ex for ex in shuffled if ex.get("teach")], [ex for ex in shuffled if not ex.get("teach")]]
        parts = [pack_best_fit(part, self.seq_len, self.pad_id) for part in groups if part]
        parts = [[p[i] for i in torch.randperm(len(p), generator=g).tolist()] for p in parts]
        keyed = sorted(((i + 0.5) / len(p), j, i) for j, p in enumerate(parts) for i in range(len(p)))
        return [parts[j][i] for _, j, i in keyed]

    def _take(self, n: int) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
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
        self.handed += [r for u in units for r in (u["records"] if "records" in u else [u.get("record")]) if r]
        if self.packing == "pad":
            self.real_tokens += sum(len(u["input_ids"]) for u in units)
            return pad_batches(units, len(units), self.pad_id)[0][0]
        self.real_tokens += sum(sum(u["lengths"]) for u in units)
        return collate(units)

    def take_records(self) -> list[tuple[str, int]]:
        out, self.handed = self.handed, []
        return out

    def new_real_tokens(self) -> int:
        """Non-pad tokens handed out (this rank) since the last call."""
        n, self._counted = self.real_tokens - self._counted, self.real_tokens
        return n

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "pos": self.pos, "real_tokens": self.real_tokens}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch, self.pos, self.real_tokens = state["epoch"], state["pos"], state["real_tokens"]
        self._counted = self.real_tokens
        self.units = self._epoch_units(self.epoch)


def load_examples(stage: SftStage, sources: dict[str, Any], tokenizer: Any,
                  held_out: bool) -> tuple[list[dict[str, Any]], dict[str, FormatStats], str | None]:
    """(examples, counts per source, chat template) of the stage's sources, one split; a training
    split holds each example of a source in `stage.repeat` that many times."""
    examples: list[dict[str, Any]] = []
    counts: dict[str, FormatStats] = {}
    template: str | None = None
    for name in stage.data:
        stats = counts[name] = FormatStats()
        times = 1 if held_out else stage.repeat.get(name, 1)
        if getattr(sources[name], "chat", None) is None:  # plain text: replayed with loss on every token
            # general text is distilled toward the teacher; a proprietary source (the customer's
            # documents) is there to be learned, so it keeps the plain language-modelling loss
            teach = stage.replay_distill and not getattr(sources[name], "proprietary", False)
            taught = {"teach": True} if teach else {}
            examples += [{**ex, **taught} for ex in text_examples(sources[name], tokenizer, stage.seq_len, held_out,
                                                                   stats)] * times
            continue
        spec = chat_spec(sources[name], f"stage {stage.name}", stage.train_on)
        made = list(sft_examples(split_rows(sources[name], held_out), tokenizer, spec, stage.seq_len, name, stats,
                                 OnError(sources[name].on_error, sources[name].max_errors)))
        examples += [{**ex, "record": (name, n)} for ex, n in zip(made, stats.kept)] * times  # names a bad batch's records
        if template is None:
            template = resolve_chat_template(tokenizer, spec)[0]
    return examples, counts, template


@torch.no_grad()
def heldout_sft_loss(model: torch.nn.Module, batches: list[dict[str, torch.Tensor]], device: torch.device) -> float:
    """Mean loss per labelled token over held-out padded batches."""
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    for b in batches:
        s, n = masked_lm_loss_sum(model, {k: v.to(device) for k, v in b.items()})
        total, count = total + s.item(), count + int(n)
    model.train(was_training)
    return total / max(count, 1)


class SftTask(Task[dict[str, torch.Tensor]]):
    """SFT's part of the loop: packed or padded batches of the examples, the masked loss (distilled
    on replayed text with `replay_distill`), held-out loss and sample generations of held-out prompts."""

    def __init__(self, stage: SftStage, s: Session, inputs: StageInputs,
                 examples: tuple[list[dict[str, Any]], list[dict[str, Any]]],
                 found: tuple[dict[str, FormatStats], str | None]):
        train, held = examples
        self.stage, self.s, self.tracker = stage, s, inputs.tracker
        self.counts, self.chat_template = found
        self.stream = SftStream(train, stage.seq_len, stage.batch_size, stage.packing, s.pad_id, stage.seed)
        super().__init__(self.stream, inputs.sources)
        self.held = pad_batches(held[: stage.eval.max_blocks * stage.batch_size * s.world], stage.batch_size,
                                s.pad_id)[0] if held else []
        chats = [n for n in stage.data if getattr(inputs.sources[n], "chat", None) is not None]  # the rest: text replay
        self.encoder = ChatEncoder(s.tokenizer, chat_spec(inputs.sources[chats[0] if chats else stage.data[0]],
                                                          f"stage {stage.name}"))
        self.prompts = _sample_prompts(stage, inputs.sources, held)
        self.sizes = {"train_examples": len(train), "heldout_examples": len(held)}
        self.masked = _loss(stage, s, train, inputs.base)
        self.evaluates, self.samples_every = bool(self.held), stage.samples.every

    def batches(self) -> list[dict[str, torch.Tensor]]:
        return [self.stream.next_batch(self.s.rank, self.s.world) for _ in range(self.stage.grad_accum)]

    def loss(self, model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor | Loss:
        return self.masked(model, batch)

    def tokens(self, batches: list[dict[str, torch.Tensor]]) -> int:
        return self.stream.new_real_tokens()

    def records(self) -> list[tuple[str, int]]:
        return self.stream.take_records()

    def evaluate(self, step: int) -> dict[str, float]:
        loss = heldout_sft_loss(self.s.model, self.held, self.s.device)
        return {"eval_loss": loss, "eval_ppl": math.exp(min(loss, 50.0))}

    def samples(self, step: int) -> None:
        s = self.s
        if self.prompts and (s.is_main or s.sharded):  # sharded weights: every rank generates, rank 0 logs
            log_samples(self.tracker, step, self.prompts,
                        generate(s.unwrapped(), s.tokenizer, self.encoder, self.prompts,
                                 Sampling(self.stage.samples.max_new_tokens), s.device))

    def row(self, out: StepResult) -> dict[str, float]:
        return {"target_tokens": float(out.targets), "epoch": self.stream.epoch}

    def finish(self, state: TrainState) -> Outcome:
        return _outcome(self.stage, self.stream, self.counts, state.tokens,
                        {**self.sizes, "template": self.chat_template})


def run(stage: SftStage, inputs: StageInputs) -> StageResult:
    where = f"stage {stage.name}"
    s = open_session(stage, inputs, lora=stage.lora)
    tracker, tok = inputs.tracker, s.tokenizer
    train, counts, template = load_examples(stage, inputs.sources, tok, held_out=False)
    if not train:
        raise ForgeError(f"{where}: no training examples in {stage.data} (all held out, too long or unlabelled)")
    held, _, _ = load_examples(stage, inputs.sources, tok, held_out=True)
    tracker.log_summary("data", {k: v for n, st in counts.items() for k, v in st.as_dict(n).items()})  # single counts
    return fit(s, SftTask(stage, s, inputs, (train, held), (counts, template)), tracker)


def _loss(stage: SftStage, s: Session, train: list[dict[str, Any]],
          base: Path | None) -> Callable[[torch.nn.Module, dict[str, torch.Tensor]], torch.Tensor | Loss]:
    """The masked LM loss, or with `replay_distill` the distilled one against a frozen copy of the
    stage's input model (or of the pipeline's base); its statistic `replay_kl` is the KL summed over
    the replayed tokens per target token of the step (the loop's statistics are means over targets)."""
    if not stage.replay_distill:
        return masked_lm_loss
    if not any(ex.get("teach") for ex in train):
        raise ForgeError(f"stage {stage.name}: replay_distill is {stage.replay_distill:g} but no source in data "
                         f"{stage.data} is plain text (a source without chat:) to replay; add one or set it to 0")
    if stage.replay_teacher == "base" and base is None:
        raise ForgeError(f"stage {stage.name}: replay_teacher: base needs the pipeline's base checkpoint (run the "
                         "stage from a recipe), or set replay_teacher: input")
    teacher, weight = s.frozen_input(base if stage.replay_teacher == "base" else None), stage.replay_distill

    def loss(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> Loss:
        total, count, kl = distilled_lm_loss_sum(model, teacher, batch, weight, collective=s.sharded)
        n = count.clamp(min=1)  # a tensor: the step reads nothing to the host
        return Loss(total / n, {"replay_kl": kl / n})
    return loss


def _outcome(stage: SftStage, data: SftStream, counts: dict[str, FormatStats], tokens: int,
             extra: dict[str, Any]) -> Outcome:
    template = extra.pop("template")
    metrics = {**extra, "epochs": data.epoch + data.pos / max(1, len(data.units))}
    if stage.packing == "best_fit":
        blocks = data.units if data.units else [{"input_ids": [0] * stage.seq_len, "lengths": [0]}]
        metrics["packing_efficiency"] = sum(sum(b["lengths"]) for b in blocks) / (len(blocks) * stage.seq_len)
    lineage = {"format": {n: c.as_dict(f"data.{n}") for n, c in counts.items()}, "chat_template": template,
               "train_on": stage.train_on or "source", "packing": stage.packing,
               **({"replay_distill": stage.replay_distill, "replay_teacher": stage.replay_teacher}
                  if stage.replay_distill else {}),
               **({"lora": stage.lora.model_dump()} if stage.lora else {})}
    return Outcome(metrics, tokens_by_source(counts, tokens, stage.repeat), lineage)


def _sample_prompts(stage: SftStage, sources: dict[str, Any], held: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """The first held-out conversations' prompts (messages up to the last user turn), for sample tables."""
    if not stage.samples.every:
        return []
    out = []
    for name in [n for n in stage.data if getattr(sources[n], "chat", None) is not None]:
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
