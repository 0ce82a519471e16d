"""Tinker's built-in loss functions, per token, as the SDK's documentation defines them; each is a
sum over every position of every datum (not a mean).

    cross_entropy        -weights * logp                               inputs: target_tokens, weights
    importance_sampling  -exp(logp - logprobs) * advantages            inputs: target_tokens, logprobs, advantages
    ppo                  -min(r * advantages, clip(r, low, high) * advantages), r = exp(logp - logprobs)
                         low/high: clip_low_threshold / clip_high_threshold, per position in
                         loss_fn_inputs or for the request in loss_fn_config (Tinker's 0.8 and 1.2)

`logp` is the trained model's log-probability of target_tokens, `logprobs` the sampler's. The
policy losses are forge's own (forge.train.losses.policy_ratio_loss, the ratio objective RFT trains).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from forge.serve.wire import Refused
from forge.train.losses import policy_ratio_loss

PerToken = Callable[[torch.Tensor, dict[str, torch.Tensor]], torch.Tensor]


@dataclass(frozen=True)
class LossFn:
    name: str
    per_token: PerToken                    # (logp, batch) -> the loss at every position
    required: tuple[str, ...] = ()          # float inputs besides target_tokens
    optional: dict[str, float] = field(default_factory=dict)  # float inputs and their value when absent
    config: dict[str, float] = field(default_factory=dict)    # loss_fn_config keys: fill inputs of the same name

    @property
    def inputs(self) -> tuple[str, ...]:
        return self.required + tuple(self.optional)


def _cross_entropy(logp: torch.Tensor, b: dict[str, torch.Tensor]) -> torch.Tensor:
    return -logp * b["weights"]


def _importance_sampling(logp: torch.Tensor, b: dict[str, torch.Tensor]) -> torch.Tensor:
    return policy_ratio_loss(logp, b["logprobs"], b["advantages"])


def _ppo(logp: torch.Tensor, b: dict[str, torch.Tensor]) -> torch.Tensor:
    return policy_ratio_loss(logp, b["logprobs"], b["advantages"], b["clip_low_threshold"], b["clip_high_threshold"])


CLIPS = {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}  # 1 -/+ Tinker's epsilon of 0.2
LOSSES: dict[str, LossFn] = {f.name: f for f in (
    LossFn("cross_entropy", _cross_entropy, optional={"weights": 1.0}),
    LossFn("importance_sampling", _importance_sampling, required=("logprobs", "advantages")),
    LossFn("ppo", _ppo, required=("logprobs", "advantages"), optional=dict(CLIPS), config=dict(CLIPS)),
)}
# the SDK's LossFnType: known to clients, not served here (docs/SERVE.md)
UNSERVED = ("cispo", "dro", "gspo", "stable_reinforce", "custom")


def loss_fn(name: str, config: dict[str, float]) -> LossFn:
    """The loss a request names, its loss_fn_config checked; a loss forge serve does not serve, or
    an unknown config key, is refused naming it."""
    served = ", ".join(LOSSES)
    if name in UNSERVED:
        raise Refused(f"loss_fn {name!r} is unsupported by forge serve; served: {served} (docs/SERVE.md)")
    fn = LOSSES.get(name)
    if fn is None:
        raise Refused(f"loss_fn {name!r} is not a loss function forge serve knows; served: {served}")
    unknown = sorted(set(config) - set(fn.config))
    if unknown:
        takes = f"takes {sorted(fn.config)}" if fn.config else "takes no configuration"
        raise Refused(f"loss_fn_config {unknown}: {name} {takes}")
    return fn
