"""One optimizer step: token-normalised gradient accumulation and the divergence guard."""
from __future__ import annotations

import math
import random
from types import SimpleNamespace

import pytest
import torch

from forge.recipe.settings import Guard, Optim
from forge.train.losses import IGNORE, masked_lm_loss
from forge.train.step import Divergence, DivergenceGuard, train_step


def _session(model):
    from accelerate import Accelerator

    from forge.train.accel import new_accelerator

    acc = new_accelerator("fp32", "test")
    opt = torch.optim.SGD(model.parameters(), lr=1.0)  # lr 1, no momentum: the update is the gradient
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    model, opt = acc.prepare(model, opt)
    assert isinstance(acc, Accelerator)
    return SimpleNamespace(accelerator=acc, model=model, optimizer=opt, scheduler=sched,
                           settings=SimpleNamespace(optim=Optim(grad_clip=None)))


def _examples(n: int, seq: int, vocab: int) -> list[dict]:
    """Micro-batch rows with very uneven numbers of target tokens (labels -100 elsewhere)."""
    rng = random.Random(0)
    rows = []
    for _ in range(n):
        ids = [rng.randrange(vocab) for _ in range(seq)]
        keep = rng.choice([1, 2, 5, seq - 1])
        labels = [IGNORE] * (seq - keep) + ids[seq - keep:]
        rows.append({"input_ids": ids, "labels": labels})
    return rows


def _batch(rows):
    return {k: torch.tensor([r[k] for r in rows]) for k in ("input_ids", "labels")}


def _weights_after_one_step(model_factory, rows, batch_size):
    model = model_factory()
    s = _session(model)
    batches = [_batch(rows[i:i + batch_size]) for i in range(0, len(rows), batch_size)]
    guard = DivergenceGuard(Guard(), "test")
    out = train_step(s, batches, masked_lm_loss, guard, step=1)
    return {k: v.detach().clone() for k, v in s.accelerator.unwrap_model(s.model).state_dict().items()}, out


def test_accumulation_equals_one_big_batch_with_uneven_masks():
    from transformers import LlamaConfig, LlamaForCausalLM

    def factory():
        torch.manual_seed(0)
        return LlamaForCausalLM(LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                            num_attention_heads=4, num_key_value_heads=2, vocab_size=64,
                                            max_position_embeddings=64))

    rows = _examples(8, 16, 64)
    small, out_small = _weights_after_one_step(factory, rows, 2)   # batch_size=2, grad_accum=4
    big, out_big = _weights_after_one_step(factory, rows, 8)       # batch_size=8, grad_accum=1
    assert out_small.targets == out_big.targets == sum(sum(t != IGNORE for t in r["labels"][1:]) for r in rows)
    assert abs(out_small.loss - out_big.loss) <= 1e-6
    worst = max((small[k] - big[k]).abs().max().item() for k in small)
    assert worst <= 1e-6, worst
    # the naive average of micro-batch means would differ: the test can tell them apart
    base = factory()
    naive = sum(masked_lm_loss(base, _batch(rows[i:i + 2])) for i in range(0, 8, 2)) / 4
    assert abs(naive.item() - out_big.loss) > 1e-3


def test_guard_trips_on_non_finite_and_on_spikes():
    guard = DivergenceGuard(Guard(spike_factor=3, window=3), "stage x")
    for loss in (2.0, 2.1, 1.9):
        assert guard.problem(loss, 1.0) is None
        guard.accept(loss)
    assert "spiked" in guard.problem(7.0, 1.0)
    assert guard.problem(5.0, 1.0) is None
    assert "loss became nan" in guard.problem(math.nan, 1.0)
    assert "gradient norm became inf" in guard.problem(2.0, math.inf)
    with pytest.raises(Divergence, match="at step 12"):
        guard.trip(12, "loss became nan")
    skipper = DivergenceGuard(Guard(action="skip", max_skips=1), "stage y")
    skipper.trip(3, "loss became nan")  # skipped, not raised
    with pytest.raises(Divergence, match="skipped 1 step"):
        skipper.trip(4, "loss became nan")
