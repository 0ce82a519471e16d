"""SFT's loss takes the LM head and the softmax only at labelled positions (forge/train/losses.py):
the loss and every gradient equal the full-logits path, for a plain model and a LoRA one; models
whose head forge cannot split off (a wrapper, another head) take the full path."""
from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from forge.train import losses


def _model() -> LlamaForCausalLM:
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, vocab_size=300))


def _batch() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 300, (3, 40), generator=g)
    labels = torch.where(torch.rand(3, 40, generator=g) < 0.3, ids, torch.full_like(ids, losses.IGNORE))
    pos = torch.cat([torch.arange(15), torch.arange(25)]).repeat(3, 1)  # two packed examples a row
    return {"input_ids": ids, "labels": labels, "position_ids": pos}


def _loss_and_grads(model, batch, selective: bool, monkeypatch):
    if not selective:
        monkeypatch.setattr(losses, "_body_and_head", lambda m: None)
    model.zero_grad()
    loss = losses.masked_lm_loss(model, batch)
    loss.backward()
    monkeypatch.undo()
    return loss.item(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("lora", [False, True])
def test_selective_head_equals_full_logits(lora, monkeypatch):
    model = _model()
    if lora:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], lora_dropout=0.0))
    assert losses._body_and_head(model) is not None
    batch = _batch()
    full, full_grads = _loss_and_grads(model, batch, False, monkeypatch)
    sel, sel_grads = _loss_and_grads(model, batch, True, monkeypatch)
    assert abs(full - sel) < 1e-6 and full > 0
    assert full_grads.keys() == sel_grads.keys() and full_grads
    for name, g in full_grads.items():
        assert torch.allclose(g, sel_grads[name], atol=1e-6), name


def test_wrapped_or_unknown_models_take_the_full_path():
    model = _model()
    wrapper = torch.nn.Module()
    wrapper.module = model  # a DDP-like wrapper: no config, its own forward
    assert losses._body_and_head(wrapper) is None
    model.config.model_type = "gemma2"  # final logit softcapping: logits are not lm_head(hidden)
    assert losses._body_and_head(model) is None
