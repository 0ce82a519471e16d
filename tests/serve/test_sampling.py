"""Sampling through the official SDK: save_weights_for_sampler (named) and a sampling client's
sample with max_tokens, temperature, top_p, seeds, stop token ids and stop strings, num_samples;
each token's log-prob the model's own (the forward's at temperature 1), the prompt's log-probs
(compute_logprobs); a sampler holds the weights of its save, not later ones; a sampler for
weights that do not exist is refused naming them."""
from __future__ import annotations

import numpy as np
import pytest

from serving import KEY, config, serving

tinker = pytest.importorskip("tinker")
PROMPT = [1, 5, 9, 17]


def test_sampling_clients_sample_with_the_sdks_parameters(tiny_checkpoint, tmp_path):
    from tinker import types

    prompt = types.ModelInput.from_ints(PROMPT)
    with serving(config(tiny_checkpoint, checkpoint_dir=str(tmp_path / "ckpt"))) as srv:
        sc = tinker.ServiceClient(base_url=srv.url, api_key=KEY)
        try:
            tc = sc.create_lora_training_client(base_model="tiny", rank=4, seed=0).result()
            path = tc.save_weights_for_sampler("start").result().path
            assert path == f"tinker://{tc.model_id}/sampler_weights/start"
            sampler = tc.create_sampling_client(path).result()
            assert sampler.get_base_model() == "tiny"

            drawn = sampler.sample(prompt, 4, types.SamplingParams(max_tokens=5, seed=7)).result()
            again = sampler.sample(prompt, 4, types.SamplingParams(max_tokens=5, seed=7)).result()
            assert [s.tokens for s in drawn.sequences] == [s.tokens for s in again.sequences]  # one seed, one draw
            assert len({tuple(s.tokens) for s in drawn.sequences}) > 1  # the samples differ from each other
            assert all(len(s.tokens) == 5 and s.stop_reason == "length" for s in drawn.sequences)
            assert len({s.sequence_id for s in drawn.sequences}) == 4

            # each sampled token's log-prob is the model's own: what forward answers for it
            seq = drawn.sequences[0]
            datum = types.Datum(model_input=types.ModelInput.from_ints(PROMPT + seq.tokens[:-1]),
                                loss_fn_inputs={"target_tokens": PROMPT[1:] + seq.tokens})
            forward = tc.forward([datum], "cross_entropy").result().loss_fn_outputs[0]["logprobs"].to_numpy()
            assert np.allclose(forward[len(PROMPT) - 1:], seq.logprobs, atol=1e-4)
            scored = sampler.compute_logprobs(types.ModelInput.from_ints(PROMPT + seq.tokens)).result()
            assert scored[0] is None and np.allclose(scored[1:], forward, atol=1e-4)

            greedy = sampler.sample(prompt, 2, types.SamplingParams(max_tokens=6, temperature=0.0)).result()
            top = greedy.sequences[0].tokens
            assert greedy.sequences[1].tokens == top
            nucleus = sampler.sample(prompt, 1, types.SamplingParams(max_tokens=6, top_p=1e-6, seed=3)).result()
            assert nucleus.sequences[0].tokens == top  # the smallest nucleus is the most likely token

            at_id = sampler.sample(prompt, 1, types.SamplingParams(max_tokens=6, temperature=0.0,
                                                                   stop=[top[2]])).result().sequences[0]
            assert at_id.stop_reason == "stop" and at_id.tokens == top[:top.index(top[2]) + 1]
            text = tc.get_tokenizer().decode(top[:3])
            at_text = sampler.sample(prompt, 1, types.SamplingParams(max_tokens=6, temperature=0.0,
                                                                     stop=[text[-2:]])).result().sequences[0]
            assert at_text.stop_reason == "stop" and len(at_text.tokens) <= 3 and text[-2:] in \
                tc.get_tokenizer().decode(at_text.tokens)

            # the sampler keeps the weights of its save: training on changes a new sampler's draws only
            d = types.Datum(model_input=types.ModelInput.from_ints(PROMPT), loss_fn_inputs={"target_tokens": [9] * 4})
            for _ in range(5):
                tc.forward_backward([d], "cross_entropy")
                tc.optim_step(types.AdamParams(learning_rate=0.05)).result()
            trained = tc.save_weights_and_get_sampling_client().result()
            params = types.SamplingParams(max_tokens=6, temperature=0.0)
            assert sampler.sample(prompt, 1, params).result().sequences[0].tokens == top
            assert trained.sample(prompt, 1, params).result().sequences[0].tokens[0] == 9
            base = sc.create_sampling_client(base_model="tiny").result()
            assert base.sample(prompt, 1, params).result().sequences[0].tokens == top  # LoRA B starts at 0

            missing = path.replace("/start", "/no-such-name")
            with pytest.raises(tinker.NotFoundError, match=f"model_path {missing}: no such checkpoint"):
                sc.create_sampling_client(model_path=missing).result()
            with pytest.raises(tinker.BadRequestError, match="model_path 'tinker://elsewhere/x': expected"):
                sc.create_sampling_client(model_path="tinker://elsewhere/x").result()
            with pytest.raises(tinker.BadRequestError, match="topk_sample_logprobs unsupported"):
                sampler.sample(prompt, 1, params, topk_sample_logprobs=2).result()
        finally:
            sc.close("success").result()
