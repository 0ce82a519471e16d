"""A supervised loop driven by the official Tinker SDK (unchanged) against `forge serve` on
127.0.0.1: capabilities, a LoRA training client, its info and tokenizer, forward_backward +
optim_step lowering the loss on chat examples, forward alone, per-token log-probs."""
from __future__ import annotations

import numpy as np
import pytest

from serving import KEY, config, datum, labelled, serving, sft_tokens

tinker = pytest.importorskip("tinker")  # the `test` extra pins tinker==0.38.0
STEPS, LR = 8, 5e-3


def test_a_supervised_loop_with_the_official_sdk_lowers_the_loss(tiny_checkpoint):
    from tinker import types

    with serving(config(tiny_checkpoint)) as srv:
        sc = tinker.ServiceClient(base_url=srv.url, api_key=KEY)
        try:
            caps = tinker.RestClient(base_url=srv.url, api_key=KEY).get_server_capabilities().result()
            assert [(m.model_name, m.max_context_length, m.trainable) for m in caps.supported_models] == \
                [("tiny", 128, True)]
            tc = sc.create_lora_training_client(base_model="tiny", rank=8, seed=0).result()
            info = tc.get_info()
            assert (info.is_lora, info.lora_rank, info.model_data.model_name) == (True, 8, "tiny")
            assert info.model_data.arch == "LlamaForCausalLM"
            tok = tc.get_tokenizer()  # from get_info's tokenizer_id: the served checkpoint's own folder
            examples = sft_tokens(tok, 5, 120)
            data, answer_tokens = [datum(e) for e in examples], labelled(examples)

            curve = []
            for _ in range(STEPS):
                fwd_bwd = tc.forward_backward(data, "cross_entropy")
                step = tc.optim_step(types.AdamParams(learning_rate=LR))
                out, stepped = fwd_bwd.result(), step.result()
                curve.append(out.metrics["loss:sum"] / answer_tokens)
                assert stepped.metrics["grad_norm"] > 0
            after = tc.forward(data, "cross_entropy").result()  # forward alone: no gradient kept, no step
            again = tc.forward(data, "cross_entropy").result()
            print("forge serve SDK loop, mean NLL per answer token:", " ".join(f"{x:.4f}" for x in curve),
                  f"-> {after.metrics['loss:sum'] / answer_tokens:.4f}")
        finally:
            sc.close("success").result()

    assert curve[-1] < 0.8 * curve[0], curve
    assert all(b < a for a, b in zip(curve, curve[1:])), curve
    assert after.metrics["loss:sum"] / answer_tokens < curve[-1]
    assert again.metrics["loss:sum"] == after.metrics["loss:sum"]  # forward changed nothing
    # per-token log-probs, one per input position, as the SDK's loss_fn_outputs carry them
    total = 0.0
    for d, o in zip(data, after.loss_fn_outputs):
        logprobs, weights = o["logprobs"].to_numpy(), d.loss_fn_inputs["weights"].to_numpy()
        assert logprobs.shape == (d.model_input.length,) and (logprobs <= 0).all()
        assert np.allclose(o["elementwise_loss"].to_numpy(), -logprobs * weights)
        total += float(-(logprobs * weights).sum())
    assert abs(total - after.metrics["loss:sum"]) <= 1e-4 * total
