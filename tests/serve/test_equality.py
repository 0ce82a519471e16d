"""forge serve's forward_backward + optim_step, driven by the official SDK, equals forge's own SFT
step (open_session + train_step + masked_lm_loss, with the recipe's own Optim/Guard/Lora classes)
on the same tokens: the same LoRA weights after every step, to 1e-6 on CPU. Weights of 1/N on the
N answer tokens make Tinker's summed cross-entropy forge's token mean; the second step splits the
batch over two forward_backward calls (forge: two micro-batches) to check the accumulation."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from serving import KEY, config, datum, labelled, serving, sft_tokens

tinker = pytest.importorskip("tinker")
SEED, RANK, ALPHA = 3, 4, 32.0
LR, BETAS, EPS, DECAY, CLIP = 1e-2, (0.9, 0.95), 1e-8, 0.01, 1.0
MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head"]
SPLITS = [[slice(0, 5)], [slice(0, 2), slice(2, 5)], [slice(0, 5)]]  # each step's forward_backward calls


def _reference(checkpoint, out_dir):
    """forge's SFT session on the same base, adapters, seed and optimizer settings."""
    from forge.recipe.settings import Guard, Lora, Optim, Schedule
    from forge.train.session import open_session

    settings = SimpleNamespace(
        name="reference", seq_len=120, precision="fp32", seed=SEED, log_every=1, compile=False, flush_denormals=False,
        optim=Optim(lr=LR, betas=BETAS, eps=EPS, weight_decay=DECAY, grad_clip=CLIP), schedule=Schedule(kind="constant"),
        eval=SimpleNamespace(every=0), checkpoint=SimpleNamespace(every=0, final_optimizer=False, keep_last_n=None),
        guard=Guard(), total_steps=lambda world=1: len(SPLITS))
    place = SimpleNamespace(checkpoint=checkpoint, out_dir=out_dir, resume=False, run_id=None, parallelism="ddp",
                            flops=None)
    return open_session(settings, place, lora=Lora(r=RANK, alpha=ALPHA, target_modules=MODULES, merge=False))


def _trainable(model) -> dict[str, torch.Tensor]:
    return {k: p.detach().clone() for k, p in model.named_parameters() if p.requires_grad}


def test_forward_backward_and_optim_step_equal_forges_own_sft_step(tiny_checkpoint, tmp_path):
    from tinker import types

    from forge.data.packing import pad_batches, pad_token_id
    from forge.train.losses import masked_lm_loss
    from forge.train.step import DivergenceGuard, train_step

    adam = types.AdamParams(learning_rate=LR, beta1=BETAS[0], beta2=BETAS[1], eps=EPS, weight_decay=DECAY,
                            grad_clip_norm=CLIP)
    served_losses, served_norms, served_weights = [], [], []
    with serving(config(tiny_checkpoint)) as srv:
        sc = tinker.ServiceClient(base_url=srv.url, api_key=KEY)
        try:
            tc = sc.create_lora_training_client(base_model="tiny", rank=RANK, seed=SEED).result()
            examples = sft_tokens(tc.get_tokenizer(), 5, 120)
            scale = 1.0 / labelled(examples)  # Tinker's sum with these weights is forge's mean over answer tokens
            served_weights.append(_trainable(srv.model(tc.model_id)))
            for calls in SPLITS:
                futures = [tc.forward_backward([datum(e, scale) for e in examples[part]], "cross_entropy")
                           for part in calls]
                stepped = tc.optim_step(adam).result()
                served_losses.append(sum(f.result().metrics["loss:sum"] for f in futures))
                served_norms.append(stepped.metrics["grad_norm"])
                served_weights.append(_trainable(srv.model(tc.model_id)))
        finally:
            sc.close("success").result()

    from forge.recipe.settings import Guard

    session = _reference(tiny_checkpoint, tmp_path / "reference")
    guard = DivergenceGuard(Guard(), "reference")
    pad = pad_token_id(session.tokenizer)
    ref_losses, ref_norms, ref_weights = [], [], [_trainable(session.model)]
    for step, calls in enumerate(SPLITS):
        batches = [pad_batches(examples[part], len(examples[part]), pad)[0][0] for part in calls]
        result = train_step(session, batches, masked_lm_loss, guard, step)
        ref_losses.append(float(result.loss))
        ref_norms.append(float(result.grad_norm))
        ref_weights.append(_trainable(session.model))
    guard.settle()

    assert served_weights[0].keys() == ref_weights[0].keys()
    assert len(ref_weights[0]) == 2 * (2 * 7 + 1)  # A and B: 7 modules in each of 2 layers, and lm_head
    worst = [max((s[k] - r[k]).abs().max().item() for k in r) for s, r in zip(served_weights, ref_weights)]
    moved = max((ref_weights[-1][k] - ref_weights[0][k]).abs().max().item() for k in ref_weights[0])
    print(f"forge serve vs forge's train_step: max |weight difference| per step {worst}, weights moved {moved:.3g}; "
          f"losses {served_losses} vs {ref_losses}; grad norms {served_norms} vs {ref_norms}")
    assert moved > 1e-3  # the steps did train
    assert max(worst) <= 1e-6, worst
    assert max(abs(a - b) / b for a, b in zip(served_losses, ref_losses)) <= 1e-6  # float32 sums in other orders
    assert max(abs(a - b) / b for a, b in zip(served_norms, ref_norms)) <= 1e-5
