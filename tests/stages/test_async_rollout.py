"""Asynchronous rollouts (rollout: {mode: off_policy_async, max_age: K}): K = 0 gives synchronous
GRPO's results; K = 1 trains on rollouts one policy version old with truncated importance weights;
rollouts older than K are dropped."""
from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from forge_testing import run_stage
from rft_rewards import RewardRows
from test_rft import REWARDS, prompts, rft

ASYNC = {"mode": "off_policy_async"}


def train(tmp_path, tiny_checkpoint, name, **kw):
    t = RewardRows()
    st = rft(f"{REWARDS}:e_share", max_steps=3, batch_size=2, group=4, max_new_tokens=8, **kw)
    result = run_stage(st, tiny_checkpoint, prompts(tmp_path), tmp_path / name, tracker=t)
    return load_file(result.checkpoint / "model.safetensors"), t.rows


def test_max_age_zero_equals_synchronous_grpo(tmp_path, tiny_checkpoint):
    sync, sync_rows = train(tmp_path, tiny_checkpoint, "sync")
    lag0, lag0_rows = train(tmp_path, tiny_checkpoint, "lag0", rollout={**ASYNC, "max_age": 0})
    assert [r["reward_mean"] for r in lag0_rows] == [r["reward_mean"] for r in sync_rows]
    assert all(torch.equal(sync[k], lag0[k]) for k in sync)
    assert all(r["rollout.age"] == 0 and "is_weight" not in r for r in lag0_rows)


def test_rollouts_one_version_old_train_with_importance_weights(tmp_path, tiny_checkpoint):
    start = load_file(tiny_checkpoint / "model.safetensors")
    weights, rows = train(tmp_path, tiny_checkpoint, "lag1", rollout={**ASYNC, "max_age": 1})
    assert [r["rollout.age"] for r in rows] == pytest.approx([0.0, 0.5, 2 / 3])  # the first is made in time
    assert "is_weight" in rows[-1] and 0 < rows[-1]["is_weight"] <= 2.0
    assert rows[-1]["rollout.dropped"] == 0
    assert any(not torch.equal(start[k], weights[k]) for k in start)


def test_rollouts_older_than_max_age_are_dropped(tmp_path, tiny_checkpoint):
    _, rows = train(tmp_path, tiny_checkpoint, "drop", updates_per_rollout=2, rollout={**ASYNC, "max_age": 1})
    assert rows[-1]["rollout.dropped"] == 1  # made at version 0 for step 3, taken at version 2
    assert rows[-1]["rollout.age"] == 0


def test_truncated_importance_weights_in_the_loss(tiny_checkpoint):
    from transformers import AutoModelForCausalLM

    from forge.stages.rft import grpo_loss, token_logps

    model = AutoModelForCausalLM.from_pretrained(tiny_checkpoint)
    ids = torch.randint(4, 100, (2, 10))
    mask, cmask = torch.ones_like(ids), torch.ones(2, 4)
    with torch.no_grad():
        old = token_logps(model, ids, mask, 6)
    b = {"ids": ids, "mask": mask, "start": torch.tensor(6), "cmask": cmask, "old": old, "adv": torch.tensor([1.0, -0.5])}
    st = rft(rollout={**ASYNC, "is_cap": 1.5})
    plain = grpo_loss(st, model, b).value.item()
    assert grpo_loss(st, model, {**b, "behav": old}).value.item() == pytest.approx(plain)
    capped = grpo_loss(st, model, {**b, "behav": old - 3.0})  # the sampler gave these tokens far less mass
    assert capped.value.item() == pytest.approx(1.5 * plain) and capped.stats["is_weight"] == pytest.approx(1.5)
