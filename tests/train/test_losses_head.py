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


def _teach(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    taught = torch.zeros_like(batch["input_ids"], dtype=torch.bool)
    taught[[0, 2], 15:] = True  # the second packed example of rows 0 and 2 is replayed text (the teacher skips row 1)
    return {**batch, "teach": taught}


def test_distilled_loss_is_the_kl_from_the_teacher_on_taught_tokens():
    import copy

    import torch.nn.functional as F

    model, batch = _model(), _teach(_batch())
    plain, n = losses.masked_lm_loss_sum(model, batch)
    # weight 0: the masked LM loss; a teacher equal to the model: taught tokens cost nothing at weight 1
    assert torch.allclose(losses.distilled_lm_loss_sum(model, model, batch, 0.0)[0], plain, atol=1e-5)
    same, count, kl = losses.distilled_lm_loss_sum(model, copy.deepcopy(model), batch, 1.0)
    keep = batch["labels"][:, 1:] != losses.IGNORE
    untaught = {**batch, "labels": batch["labels"].masked_fill(batch["teach"], losses.IGNORE)}
    assert count == n and abs(float(kl)) < 1e-5
    assert torch.allclose(same, losses.masked_lm_loss_sum(model, untaught)[0], atol=1e-5)
    # another teacher: the taught tokens' share is its KL divergence, written out here
    teacher = _model()
    with torch.no_grad():
        for p in teacher.parameters():
            p.add_(0.05 * torch.randn_like(p))
    got, _, kl = losses.distilled_lm_loss_sum(model, teacher, batch, 0.5)
    taught = batch["teach"][:, 1:][keep]
    with torch.no_grad():  # no cache: a cache would disable the packed (per-example) attention
        s, t = (F.log_softmax(m(input_ids=batch["input_ids"], position_ids=batch["position_ids"], use_cache=False)
                              .logits[:, :-1][keep], -1) for m in (model, teacher))
    ce = -s.gather(1, batch["labels"][:, 1:][keep][:, None])[:, 0]
    want_kl = (t.exp() * (t - s)).sum(-1)[taught].sum()
    assert float(want_kl) > 1e-3 and torch.allclose(kl, want_kl, atol=1e-4)
    want = ce[~taught].sum() + 0.5 * ce[taught].sum() + 0.5 * want_kl
    assert torch.allclose(got, want, atol=1e-4)


@pytest.mark.parametrize("collective", [False, True])
def test_the_teacher_skips_untaught_micro_batches_unless_its_forward_is_collective(collective):
    """A micro-batch without replayed text costs no teacher forward, except with a sharded teacher,
    whose forward every rank must join (one row, its result unused); the loss is the masked LM loss."""
    model, batch, teacher = _model(), _batch(), _model()
    calls = []
    teacher.model.register_forward_hook(lambda m, a, out: calls.append(m))
    got, n, kl = losses.distilled_lm_loss_sum(model, teacher, {**batch, "teach": torch.zeros_like(batch["input_ids"],
                                                                                                   dtype=torch.bool)},
                                              1.0, collective=collective)
    assert len(calls) == int(collective) and float(kl) == 0.0
    assert torch.allclose(got, losses.masked_lm_loss_sum(model, batch)[0], atol=1e-6)
    calls.clear()
    losses.distilled_lm_loss_sum(model, teacher, _teach(batch), 1.0, collective=collective)
    assert len(calls) == 1  # taught rows: the teacher runs either way
