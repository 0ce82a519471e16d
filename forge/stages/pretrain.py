"""Continued pretraining and mid-training: causal-LM loss over packed, mixed token blocks.

Its own part of the loop (forge.train.loop.fit): each optimizer step draws `grad_accum`
micro-batches of packed `seq_len` blocks from the mixture by token share; held-out loss per
source is the evaluation. The launch's blocks are planned once, by rank 0, into the stage's
`blocks/` folder, and each rank cuts only its own (forge.data.mixing.launch_mixture). A midtrain
stage may extend the context (RoPE) and decays its learning rate (anneal or WSD) by default.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from forge.data.blocks import Ranks
from forge.data.mixing import Mix, MixedBlocks, launch_mixture
from forge.lm.perplexity import loss_metrics, source_blocks, source_losses
from forge.recipe.settings import MidtrainStage, PretrainStage
from forge.stages.result import StageInputs, StageResult
from forge.train.checkpoint import load_position
from forge.train.context import extend_context
from forge.train.loop import fit
from forge.train.losses import Loss, causal_lm_loss
from forge.train.session import Session, open_session
from forge.train.state import TrainState
from forge.train.step import Record, StepResult
from forge.train.task import Outcome, Task


def run(stage: PretrainStage, inputs: StageInputs) -> StageResult:
    configure: Callable[[Any], Any] | None = None
    if isinstance(stage, MidtrainStage) and stage.context:
        mid, ctx = stage, stage.context
        configure = lambda cfg: extend_context(cfg, ctx, mid.context_length(), f"stage {mid.name}")  # noqa: E731
    s = open_session(stage, inputs, configure)
    blocks = _launch_blocks(s, stage.grad_accum * stage.batch_size * s.world)
    ranks = Ranks(inputs.out_dir / "blocks", s.rank, s.world, s.accelerator.wait_for_everyone)
    mix = launch_mixture(inputs.sources, Mix(stage.weights, stage.seq_len, stage.separator, stage.max_repeats,
                                             stage.on_exhausted), s.tokenizer, blocks, ranks)
    return fit(s, PretrainTask(stage, s, mix, inputs.sources), inputs.tracker)


class PretrainTask(Task[torch.Tensor]):
    """Pretraining's part of the loop: `grad_accum` micro-batches of packed blocks from the mixture
    each step, the causal-LM loss, held-out loss per source, and the mixture's figures in the log."""

    def __init__(self, stage: PretrainStage, s: Session, mix: MixedBlocks, sources: dict[str, Any]):
        super().__init__(mix, sources)
        self.stage, self.s, self.mix = stage, s, mix
        # each source's own held-out blocks: the mixed figure is their token-weighted mean
        self.held_out = source_blocks(sources, stage.weights, s.tokenizer, stage.seq_len, stage.separator,
                                      stage.eval.max_blocks)
        self.evaluates = bool(self.held_out)  # no source has held-out blocks: no evaluation

    def batches(self) -> list[torch.Tensor]:
        return [self.mix.next_batch(self.stage.batch_size, self.s.rank, self.s.world)
                for _ in range(self.stage.grad_accum)]

    def loss(self, model: torch.nn.Module, batch: torch.Tensor) -> torch.Tensor | Loss:
        return causal_lm_loss(model, batch)

    def tokens(self, batches: list[torch.Tensor]) -> int:
        return sum(b.numel() for b in batches)

    def records(self) -> list[Record]:
        return self.mix.take_records()

    def evaluate(self, step: int) -> dict[str, float]:
        return loss_metrics(source_losses(self.s.model, self.held_out, self.stage.batch_size, self.s.device))

    def row(self, out: StepResult) -> dict[str, float]:
        return {**{f"tokens.{k}": v for k, v in self.mix.taken.items()},
                **{f"repeats.{k}": v for k, v in self.mix.repeats().items()}}

    def finish(self, state: TrainState) -> Outcome:
        return _outcome(self.stage, self.mix, state, self.s.total_steps * self.stage.tokens_per_step * self.s.world)


def _launch_blocks(s: Session, per_step: int) -> int:
    """Every rank's blocks this launch draws, to the stage's end: from the resume point's position when
    resuming (a checkpoint of another number of processes drew its blocks at its own rate)."""
    if s.resume_from is None:
        return s.total_steps * per_step
    saved = load_position(s.resume_from)
    drawn = int((saved.get("data") or {}).get("block", 0))
    return drawn + max(0, s.total_steps - int(saved["step"])) * per_step


def _outcome(stage: PretrainStage, mix: MixedBlocks, state: TrainState, block_tokens: int) -> Outcome:
    # real tokens / block tokens: blocks are cut from the joined stream, so nothing is padding
    metrics = {"packing_efficiency": sum(mix.taken.values()) / max(1, block_tokens)}
    repeats = mix.repeats()
    tags: dict[str, str] = {}
    if any(repeats.values()):
        tags["repeats"] = ", ".join(f"{k}={v}" for k, v in repeats.items() if v)
    if mix.rebalanced:
        tags["rebalanced"] = ", ".join(mix.rebalanced)
    lineage: dict[str, Any] = {"repeats": repeats, "shares": mix.shares(), "rebalanced": list(mix.rebalanced)}
    if isinstance(stage, MidtrainStage) and stage.context:
        lineage["context"] = {"max_position": stage.context_length(), **stage.context.model_dump(exclude_none=True)}
    return Outcome(metrics, dict(mix.taken), lineage, tags)
