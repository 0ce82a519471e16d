"""Preference losses: sequence log-probabilities of replies and the DPO family on them.

Sigmoid DPO (Rafailov et al. 2023, eq. 7) with conservative label smoothing ε (Mitchell 2023,
cDPO): loss = -(1-ε)·logσ(βΔ) - ε·logσ(-βΔ), Δ = (log π(y_w) - log π_ref(y_w)) - (log π(y_l) -
log π_ref(y_l)); with ε = 0 this is TRL's `sigmoid` loss. IPO (Azar et al. 2023, eq. 17) with
log-ratios averaged per reply token, as TRL does: loss = (Δ_avg - 1/(2β))². Rewards are β times
the log-ratios; margin = chosen - rejected reward; accuracy = share of pairs with margin > 0.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from forge.train.losses import IGNORE


def sequence_logps(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, labels: torch.Tensor
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum of log-probs of each row's labelled tokens, number of labelled tokens), right-padded rows."""
    logits = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits[:, :-1].float()
    target = labels[:, 1:]
    mask = target != IGNORE
    logp = torch.gather(F.log_softmax(logits, dim=-1), 2, target.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    return (logp * mask).sum(dim=1), mask.sum(dim=1)


@dataclass
class PreferenceOut:
    loss: torch.Tensor            # mean over pairs
    chosen_rewards: torch.Tensor  # per pair, detached
    rejected_rewards: torch.Tensor

    def stats(self) -> dict[str, torch.Tensor]:
        """0-d tensors on the device (a training step reads nothing to the host)."""
        margin = self.chosen_rewards - self.rejected_rewards
        return {"rewards/chosen": self.chosen_rewards.mean(), "rewards/rejected": self.rejected_rewards.mean(),
                "rewards/margin": margin.mean(), "rewards/accuracy": (margin > 0).float().mean()}


def dpo_loss(policy: torch.Tensor, reference: torch.Tensor, beta: float, label_smoothing: float = 0.0,
             kind: str = "sigmoid", tokens: torch.Tensor | None = None) -> PreferenceOut:
    """The loss of a batch of pairs from the policy's and reference's summed reply log-probs, each
    (pairs, 2): column 0 the chosen reply, column 1 the rejected one; `tokens` the reply lengths (IPO)."""
    chosen_ratio, rejected_ratio = policy[:, 0] - reference[:, 0], policy[:, 1] - reference[:, 1]
    if kind == "sigmoid":
        delta = beta * (chosen_ratio - rejected_ratio)
        losses = -(1 - label_smoothing) * F.logsigmoid(delta) - label_smoothing * F.logsigmoid(-delta)
    elif kind == "ipo":
        if tokens is None:
            raise ValueError("IPO averages log-ratios per reply token: give the reply token counts")
        delta = chosen_ratio / tokens[:, 0].clamp(min=1) - rejected_ratio / tokens[:, 1].clamp(min=1)
        losses = (delta - 1 / (2 * beta)) ** 2
    else:
        raise ValueError(f"unknown preference loss {kind!r}; expected 'sigmoid' or 'ipo'")
    return PreferenceOut(losses.mean(), beta * chosen_ratio.detach(), beta * rejected_ratio.detach())
