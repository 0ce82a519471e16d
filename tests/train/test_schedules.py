"""Learning-rate schedules against their formulas."""
from __future__ import annotations

import math

import pytest
import torch

from forge.recipe.settings import Schedule
from forge.train.optim import build_scheduler, lr_factor

TOTAL = 100


@pytest.mark.parametrize("shape", ["linear", "cosine", "sqrt"])
def test_wsd_warmup_then_stable_then_decay_to_floor(shape):
    cfg = Schedule(kind="wsd", warmup_steps=10, decay_fraction=0.2, decay=shape, min_lr_ratio=0.0)
    f = [lr_factor(s, TOTAL, cfg) for s in range(TOTAL + 1)]
    assert f[:10] == pytest.approx([(s + 1) / 10 for s in range(10)])
    assert f[10:80] == [1.0] * 70  # stable until the last 20% of steps
    for s in range(80, TOTAL + 1):
        p = (s - 80) / 20
        want = {"linear": 1 - p, "cosine": 0.5 * (1 + math.cos(math.pi * p)), "sqrt": 1 - math.sqrt(p)}[shape]
        assert f[s] == pytest.approx(want, abs=1e-12)
    assert f[TOTAL] == 0.0  # the rate after the last step is the floor


def test_wsd_floor():
    cfg = Schedule(kind="wsd", decay_fraction=0.5, decay="linear", min_lr_ratio=0.1)
    assert lr_factor(50, TOTAL, cfg) == 1.0
    assert lr_factor(75, TOTAL, cfg) == pytest.approx(0.1 + 0.9 * 0.5)
    assert lr_factor(TOTAL, TOTAL, cfg) == pytest.approx(0.1)


def test_anneal_is_linear_from_the_peak_to_zero():
    cfg = Schedule(kind="anneal", warmup_steps=0)
    assert [lr_factor(s, TOTAL, cfg) for s in (0, 25, 50, 99, 100)] == pytest.approx([1, 0.75, 0.5, 0.01, 0])
    warm = Schedule(kind="anneal", warmup_steps=20)
    assert lr_factor(19, TOTAL, warm) == 1.0 and lr_factor(60, TOTAL, warm) == pytest.approx(0.5)


def test_scheduler_applies_the_factor_to_the_optimizer():
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=0.5)
    sched = build_scheduler(opt, 10, Schedule(kind="wsd", decay_fraction=0.5, decay="sqrt", min_lr_ratio=0))
    seen = []
    for _ in range(10):
        seen.append(sched.get_last_lr()[0])
        opt.step()
        sched.step()
    assert seen[:5] == [0.5] * 5
    assert seen[7] == pytest.approx(0.5 * (1 - math.sqrt(2 / 5)))
