"""Held-out loss and perplexity of a causal LM on fixed token blocks."""
from __future__ import annotations

import torch


@torch.no_grad()
def heldout_loss(model, blocks: torch.Tensor, batch_size: int, device) -> float:
    """Mean next-token loss over held-out blocks (every predicted token weighted equally)."""
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    for i in range(0, len(blocks), batch_size):
        x = blocks[i:i + batch_size].to(device)
        loss = model(input_ids=x, labels=x).loss
        n = x.shape[0] * (x.shape[1] - 1)
        total, count = total + loss.item() * n, count + n
    model.train(was_training)
    return total / count
