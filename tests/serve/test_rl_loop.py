"""An RL loop in the style of tinker-cookbook's recipes/rl_loop.py, driven by the official SDK
against forge serve: each step a sampler of the current weights (save_weights_and_get_sampling_client),
a group of samples per prompt, a Python reward, advantages centred per group (GRPO), datums of
prompt + completion with the sampler's log-probs, importance_sampling, optim_step. The reward (the
share of completion tokens in a set of 64 of the tiny model's 384) is one a random tiny model
learns in a few steps: its mean rises."""
from __future__ import annotations

import pytest

from serving import KEY, config, serving

tinker = pytest.importorskip("tinker")
REWARDED = frozenset(range(100, 164))  # the "particular tokens": 1/6 of the vocabulary
PROMPTS = [[1, 5, 9], [1, 7, 11, 13]]
GROUP, STEPS, MAX_TOKENS, LR = 16, 10, 6, 2e-2


def reward(tokens: list[int]) -> float:
    return sum(t in REWARDED for t in tokens) / len(tokens)


def test_an_rl_loop_with_importance_sampling_raises_the_mean_reward(tiny_checkpoint):
    from tinker import types

    curve = []
    with serving(config(tiny_checkpoint)) as srv:
        sc = tinker.ServiceClient(base_url=srv.url, api_key=KEY)
        try:
            tc = sc.create_lora_training_client(base_model="tiny", rank=8, seed=0).result()
            adam = types.AdamParams(learning_rate=LR, beta1=0.9, beta2=0.95, eps=1e-8)
            for step in range(STEPS):
                sampler = tc.save_weights_and_get_sampling_client().result()
                futures = [sampler.sample(types.ModelInput.from_ints(p), GROUP,
                                          types.SamplingParams(max_tokens=MAX_TOKENS, seed=100 * step + i))
                           for i, p in enumerate(PROMPTS)]
                data, rewards = [], []
                for prompt, future in zip(PROMPTS, futures):
                    sequences = future.result().sequences
                    group = [reward(s.tokens) for s in sequences]
                    rewards += group
                    mean = sum(group) / len(group)
                    if all(r == mean for r in group):  # nothing to learn from this group (as the cookbook skips it)
                        continue
                    for seq, r in zip(sequences, group):
                        ob = len(prompt) - 1  # the prompt's positions after its first carry no loss
                        model_input = types.ModelInput.from_ints(prompt).append(
                            types.EncodedTextChunk(tokens=seq.tokens[:-1]))
                        data.append(types.Datum(model_input=model_input, loss_fn_inputs={
                            "target_tokens": [0] * ob + seq.tokens, "logprobs": [0.0] * ob + seq.logprobs,
                            "advantages": [0.0] * ob + [r - mean] * len(seq.tokens)}))
                curve.append(sum(rewards) / len(rewards))
                if not data:
                    continue
                fwd = tc.forward_backward(data, "importance_sampling")
                stepped = tc.optim_step(adam).result()
                # on-policy: the sampler's log-probs are the trained model's, every ratio is 1
                assert fwd.result().metrics["loss:sum"] == pytest.approx(
                    -sum(float(d.loss_fn_inputs["advantages"].to_numpy().sum()) for d in data), abs=1e-3)
                assert stepped.metrics["grad_norm"] > 0
        finally:
            sc.close("success").result()
    print("forge serve RL loop (importance_sampling), mean reward per step:", " ".join(f"{r:.3f}" for r in curve))
    first, last = sum(curve[:3]) / 3, sum(curve[-3:]) / 3
    assert last > first + 0.25, curve
    assert curve[-1] > 0.5, curve
