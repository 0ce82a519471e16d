"""The policy losses as the official SDK sends them (target_tokens, the sampler's logprobs,
advantages): importance_sampling = -(exp(logp - logprobs) * advantages), ppo clipped at 0.8/1.2
or at the request's loss_fn_config or the datum's own thresholds, each per token and summed; the
step's loss is the forward's, and the gradient is that of the formula."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from serving import KEY, config, serving, trainable

tinker = pytest.importorskip("tinker")
TOKENS = [1, 5, 9, 17, 33, 65, 129]
OLD = np.array([0.0, -6.1, -5.8, -6.3, -5.5, -7.0, -6.0], dtype=np.float32)  # the "sampler's" log-probs
ADV = np.array([0.0, 1.0, -1.0, 2.0, -0.5, 1.5, -2.0], dtype=np.float32)


def _datum(**extra):
    from tinker import types

    return types.Datum(model_input=types.ModelInput.from_ints(TOKENS[:-1] + [3]),
                       loss_fn_inputs={"target_tokens": TOKENS[1:] + [7], "logprobs": OLD.tolist(),
                                       "advantages": ADV.tolist(), **extra})


def _ppo(logp, low, high):
    ratio = np.exp(logp - OLD)
    return -np.minimum(ratio * ADV, np.clip(ratio, low, high) * ADV)


def test_importance_sampling_and_ppo_follow_tinkers_formulas(tiny_checkpoint):
    from tinker import types

    with serving(config(tiny_checkpoint)) as srv:
        sc = tinker.ServiceClient(base_url=srv.url, api_key=KEY)
        try:
            tc = sc.create_lora_training_client(base_model="tiny", rank=2, seed=0).result()
            out = tc.forward([_datum()], "importance_sampling").result()
            logp = out.loss_fn_outputs[0]["logprobs"].to_numpy()
            want = -np.exp(logp - OLD) * ADV
            assert np.allclose(out.loss_fn_outputs[0]["elementwise_loss"].to_numpy(), want, atol=1e-5)
            assert out.metrics["loss:sum"] == pytest.approx(float(want.sum()), abs=1e-4)

            for config_, extra, (low, high) in [({}, {}, (0.8, 1.2)),
                                               ({"clip_low_threshold": 0.5, "clip_high_threshold": 1.05}, {},
                                                (0.5, 1.05)),
                                               ({}, {"clip_low_threshold": [0.9] * 7, "clip_high_threshold": [1.01] * 7},
                                                (0.9, 1.01))]:
                got = tc.forward([_datum(**extra)], "ppo", loss_fn_config=config_ or None).result()
                assert np.allclose(got.loss_fn_outputs[0]["elementwise_loss"].to_numpy(), _ppo(logp, low, high),
                                   atol=1e-5), (config_, extra)
            assert _ppo(logp, 0.8, 1.2).sum() != pytest.approx(_ppo(logp, 0.5, 1.05).sum())  # the clip mattered

            before = trainable(srv.model(tc.model_id))
            fwd = tc.forward_backward([_datum()], "importance_sampling").result()
            stepped = tc.optim_step(types.AdamParams(learning_rate=0.0)).result()  # the gradient, no update
            assert stepped.metrics["loss:sum"] == pytest.approx(fwd.metrics["loss:sum"], rel=1e-5)
            assert stepped.metrics["tokens"] == len(TOKENS)
            served_norm = stepped.metrics["grad_norm"]
            model = srv.model(tc.model_id)
            assert all(torch.equal(before[k], v) for k, v in trainable(model).items())
        finally:
            sc.close("success").result()

    # the formula's own gradient, by autograd on the served model's weights
    model.zero_grad()
    logits = model(input_ids=torch.tensor([TOKENS[:-1] + [3]])).logits[0].float()
    picked = torch.log_softmax(logits, -1).gather(1, torch.tensor(TOKENS[1:] + [7]).unsqueeze(1)).squeeze(1)
    loss = -(torch.exp(picked - torch.from_numpy(OLD)) * torch.from_numpy(ADV)).sum()
    loss.backward()
    norm = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in model.parameters() if p.grad is not None]))
    assert served_norm == pytest.approx(float(norm), rel=1e-4)
