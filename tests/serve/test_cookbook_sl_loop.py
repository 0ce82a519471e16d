"""tinker-cookbook's supervised loop (recipes/sl_loop.py) against `forge serve`, with the cookbook's
own pieces where they run offline: its `role_colon` renderer and `conversation_to_datum` turn MedQuAD
chats into Datums, the loop sends them with `forward_backward` + `optim_step` at the cookbook's
linearly decaying learning rate and Adam betas, and the cookbook's `compute_mean_nll` reads the loss.
(sl_loop.py itself fetches its dataset and tokenizer from the Hub, and the cookbook's llama3/qwen
renderers need those models' special tokens, which the tiny test model does not have.)"""
from __future__ import annotations

import pytest

from serving import KEY, config, rows, serving

tinker = pytest.importorskip("tinker")
pytest.importorskip("tinker_cookbook.supervised.data")  # .ci/run installs the cookbook and its importable deps
STEPS, BATCH, LR = 8, 4, 5e-3


def test_the_cookbooks_renderer_and_datums_train_through_forge_serve(tiny_checkpoint):
    from tinker_cookbook import renderers
    from tinker_cookbook.supervised.common import compute_mean_nll
    from tinker_cookbook.supervised.data import conversation_to_datum
    from transformers import AutoTokenizer

    renderer = renderers.get_renderer("role_colon", AutoTokenizer.from_pretrained(tiny_checkpoint))
    chats = [row["messages"] for _, _, row in rows(STEPS * BATCH)]
    with serving(config(tiny_checkpoint)) as srv:
        sc = tinker.ServiceClient(base_url=srv.url, api_key=KEY)
        try:
            tc = sc.create_lora_training_client(base_model="tiny", rank=8).result()
            batches = [[conversation_to_datum(c, renderer, 120, renderers.TrainOnWhat.ALL_ASSISTANT_MESSAGES)
                        for c in chats[i * BATCH:(i + 1) * BATCH]] for i in range(STEPS)]
            first = tc.forward(batches[0], "cross_entropy").result()
            curve = []
            for step, batch in enumerate(batches):
                lr = LR * max(0.0, 1.0 - step / STEPS)
                fwd_bwd = tc.forward_backward(batch, loss_fn="cross_entropy")
                optim = tc.optim_step(tinker.AdamParams(learning_rate=lr, beta1=0.9, beta2=0.95, eps=1e-8))
                out, _ = fwd_bwd.result(), optim.result()
                curve.append(compute_mean_nll([o["logprobs"] for o in out.loss_fn_outputs],
                                              [d.loss_fn_inputs["weights"] for d in batch]))
            after = tc.forward(batches[0], "cross_entropy").result()
        finally:
            sc.close("success").result()

    def nll(result) -> float:
        return compute_mean_nll([o["logprobs"] for o in result.loss_fn_outputs],
                                [d.loss_fn_inputs["weights"] for d in batches[0]])

    print("cookbook sl loop through forge serve, mean NLL:", " ".join(f"{x:.3f}" for x in curve),
          f"| batch 0: {nll(first):.3f} -> {nll(after):.3f}")
    assert all(sum(d.loss_fn_inputs["weights"].to_numpy()) > 0 for b in batches for d in b)  # answers weighted
    assert nll(after) < 0.9 * nll(first)
    assert curve[-1] < 0.9 * curve[0]
