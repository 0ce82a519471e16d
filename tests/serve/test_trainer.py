"""A served model without the HTTP layer: a step with nothing kept, and a non-finite loss, which
forge's guard skips and the step's (JSON) metrics leave out."""
from __future__ import annotations

import json

import numpy as np
import torch

from forge.serve.batch import Example
from forge.serve.losses import LOSSES
from forge.serve.trainer import ServedModel, Settings
from forge.serve.wire import AdamParams, LoraRequest


def _trainable(model) -> dict[str, torch.Tensor]:
    return {k: p.detach().clone() for k, p in model.named_parameters() if p.requires_grad}


def test_an_empty_step_changes_nothing_and_a_non_finite_loss_is_skipped(tiny_checkpoint, tmp_path):
    served = ServedModel.open(tiny_checkpoint, LoraRequest(rank=2, seed=0), 32.0,
                              Settings(name="model m", precision="fp32", seed=0), tmp_path / "m")
    before = _trainable(served.session.model)
    metrics = served.optim_step(AdamParams(learning_rate=1e-2))
    assert metrics["grad_norm"] == 0.0 and "skipped" not in metrics
    assert all(torch.equal(before[k], v) for k, v in _trainable(served.session.model).items())

    tokens = np.array([1, 5, 9, 17], dtype=np.int64)
    item = Example(tokens, np.roll(tokens, -1), {"weights": np.ones(4, dtype=np.float32)})
    with torch.no_grad():  # a diverged adapter on the head: every logit becomes NaN
        next(p for n, p in served.session.model.named_parameters() if "lm_head.lora_B" in n).fill_(float("nan"))
    poisoned = _trainable(served.session.model)
    out = served.forward_backward([item], seq_id=1, backward=True, fn=LOSSES["cross_entropy"])
    assert np.isnan(out.loss_sum)
    metrics = served.optim_step(AdamParams(learning_rate=1e-2))
    assert metrics["skipped"] == 1.0 and "loss:sum" not in metrics
    json.dumps(metrics, allow_nan=False)  # what the future's JSON answer needs
    after = _trainable(served.session.model)
    assert all(torch.allclose(poisoned[k], after[k], rtol=0, atol=0, equal_nan=True) for k in after)  # not updated
