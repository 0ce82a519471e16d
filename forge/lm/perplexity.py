"""Held-out loss and perplexity of a causal LM on fixed token blocks, per data source.

Each source gets its own held-out blocks (never mixed across sources), so a stage can report
the domain falling and the general text holding; the mixed figure is the token-weighted mean of
the per-source losses (every predicted token weighted equally, whichever source it came from).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable

import torch

Device = torch.device | str


@torch.no_grad()
def heldout_sums(model: torch.nn.Module, blocks: torch.Tensor, batch_size: int, device: Device) -> tuple[float, int]:
    """(sum of next-token losses, number of predicted tokens) over held-out blocks."""
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    for i in range(0, len(blocks), batch_size):
        x = blocks[i:i + batch_size].to(device)
        loss = model(input_ids=x, labels=x).loss
        n = x.shape[0] * (x.shape[1] - 1)
        total, count = total + loss.item() * n, count + n
    model.train(was_training)
    return total, count


def heldout_loss(model: torch.nn.Module, blocks: torch.Tensor, batch_size: int, device: Device) -> float:
    """Mean next-token loss over held-out blocks (every predicted token weighted equally)."""
    total, count = heldout_sums(model, blocks, batch_size, device)
    return total / count


def source_blocks(sources: dict[str, Any], names: Iterable[str], tokenizer: Any, seq_len: int, separator: str,
                  max_blocks: int) -> dict[str, torch.Tensor]:
    """Up to `max_blocks` held-out blocks of each named source (sources with none are left out)."""
    from forge.data.mixing import eval_blocks

    out = {}
    for name in names:
        blocks = eval_blocks(sources, {name: 1.0}, tokenizer, seq_len, separator, max_blocks)
        if blocks is not None:
            out[name] = blocks
    return out


@dataclass
class SourceLoss:
    loss: float
    tokens: int

    @property
    def ppl(self) -> float:
        return math.exp(min(self.loss, 700.0))  # past ~709 exp overflows; such a model is broken anyway


def source_losses(model: torch.nn.Module, blocks: dict[str, torch.Tensor], batch_size: int,
                  device: Device) -> dict[str, SourceLoss]:
    out = {}
    for name, b in blocks.items():
        total, count = heldout_sums(model, b, batch_size, device)
        out[name] = SourceLoss(total / count, count)
    return out


def mixed_loss(losses: dict[str, SourceLoss]) -> float:
    """The per-source losses averaged by their token counts."""
    return sum(v.loss * v.tokens for v in losses.values()) / sum(v.tokens for v in losses.values())


def loss_metrics(losses: dict[str, SourceLoss], prefix: str = "eval") -> dict[str, float]:
    """{'eval_loss', 'eval_ppl', 'eval.<source>.loss', 'eval.<source>.ppl'} for a tracker."""
    mixed = mixed_loss(losses)
    row = {f"{prefix}_loss": mixed, f"{prefix}_ppl": SourceLoss(mixed, 0).ppl}
    for name, v in losses.items():
        row[f"{prefix}.{name}.loss"] = v.loss
        row[f"{prefix}.{name}.ppl"] = v.ppl
    return row
