"""Packed SFT rows attend as one causal row per example (forge/train/attention.py, the indices from
forge.data.packing.segments): the same logits and gradients as transformers' block-diagonal mask,
the layout's indices invert each other, a checkpoint loaded for training uses it, and nothing of
it reaches a saved config."""
from __future__ import annotations

import json
import random

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig

from forge.data.packing import collate, pack_best_fit, segments
from forge.train import attention
from forge.train.checkpointer import FullCheckpointer
from forge.train.losses import distilled_lm_loss_sum, masked_lm_loss_sum


def tiny(seed: int = 0):
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=64)  # grouped-query attention, as Llama 3
    return AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa")


def packed_batch(seed: int, rows: int = 3, width: int = 48):
    rng = random.Random(seed)
    examples = [{"input_ids": [rng.randrange(3, 96) for _ in range(n)], "labels": [rng.randrange(3, 96) for _ in range(n)]}
                for n in (rng.choice([1, 2, 5, 9, 17, 30, 48]) for _ in range(12))]
    return collate(pack_best_fit(examples, width, 0)[:rows])


@pytest.mark.parametrize("seed", range(4))
def test_the_layout_puts_every_token_back_and_pads_an_example_at_most_twofold(seed):
    pos = packed_batch(seed)["position_ids"]
    gathers, scatter = segments(pos)
    flat = torch.arange(pos.numel())
    laid = torch.cat([flat[g].reshape(-1) for g in gathers])
    assert torch.equal(laid[scatter], flat)  # gather then scatter: every token at its place
    starts = (pos.reshape(-1) == 0).sum() + (pos[:, 0] != 0).sum()
    assert sum(len(g) for g in gathers) == starts  # a row per example (padding counts as one)
    for g in gathers:
        lengths = torch.tensor([len(set(row.tolist())) for row in g])
        assert g.shape[1] == lengths.max() and (2 * lengths > g.shape[1]).all()


@pytest.mark.parametrize("seed", range(3))
def test_logits_and_gradients_equal_the_block_diagonal_mask(seed):
    model, batch = tiny(seed), packed_batch(seed)

    def run(packed: bool):
        model.set_attn_implementation(attention.NAME if packed else "sdpa")
        model.zero_grad()
        total, n = masked_lm_loss_sum(model, batch)
        (total / n).backward()
        return total.detach(), torch.cat([p.grad.flatten() for p in model.parameters()])

    assert attention.use_packed_attention(model)
    (a, ga), (b, gb) = run(True), run(False)
    assert torch.allclose(a, b, rtol=1e-6, atol=1e-6)
    assert (ga - gb).abs().max() <= 1e-5 * gb.abs().max()


def test_the_teacher_reads_its_rows_without_the_layout():
    model, teacher, batch = tiny(1), tiny(2), packed_batch(5)
    batch["teach"] = torch.zeros_like(batch["input_ids"], dtype=torch.bool)
    batch["teach"][1] = True
    plain = {k: v for k, v in batch.items() if not k.startswith(attention.PREFIX)}
    attention.use_packed_attention(model)
    attention.use_packed_attention(teacher)
    got = distilled_lm_loss_sum(model, teacher, batch, 1.0)
    want = distilled_lm_loss_sum(model, teacher, plain, 1.0)
    assert all(torch.allclose(x, y, rtol=1e-5, atol=1e-5) for x, y in zip(got, want))


def test_a_training_checkpoint_attends_packed_and_saves_a_plain_config(tmp_path):
    tiny().save_pretrained(tmp_path / "base")
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast
    PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel({"a": 0, "[UNK]": 1}, unk_token="[UNK]")),
                            eos_token="a").save_pretrained(tmp_path / "base")
    model, _ = FullCheckpointer(None).load_model(tmp_path / "base")
    assert attention.uses_packed_attention(model)
    model.save_pretrained(tmp_path / "saved")
    assert attention.NAME not in json.dumps(json.loads((tmp_path / "saved" / "config.json").read_text()))
    eager = AutoModelForCausalLM.from_pretrained(tmp_path / "base", attn_implementation="eager")
    assert not attention.use_packed_attention(eager)  # only a model on plain SDPA is switched


class Layer:  # what transformers' SDPA reads of an attention layer
    is_causal, num_key_value_groups = True, 1


def fwd_bwd(fn, q, k, v, **kwargs):
    q, k, v = (x.detach().requires_grad_() for x in (q, k, v))
    out, _ = fn(Layer(), q, k, v, **kwargs)
    (out * torch.linspace(-1, 1, out.numel()).view(out.shape)).sum().backward()
    return out.detach(), torch.cat([x.grad.flatten() for x in (q, k, v)])


@pytest.mark.parametrize("head_dim,length", [(8, 128), (8, 200), (8, 512), (32, 256), (32, 300), (64, 129)])
def test_query_blocks_attend_as_one_causal_call(head_dim, length):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    torch.manual_seed(length)
    q, k, v = (torch.randn(2, 3, length, head_dim) for _ in range(3))
    attention.query_blocks.cache_clear()
    got, got_grad = fwd_bwd(attention.causal_sdpa, q, k, v)
    want, want_grad = fwd_bwd(lambda m, *x: sdpa_attention_forward(m, *x, None, is_causal=True), q, k, v)
    blocks = attention.query_blocks.cache_info().currsize
    assert blocks == (1 if length >= 2 * (64 if head_dim <= 16 else 128) else 0)  # 129 tokens at head_dim 64: one call
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-6)
    assert (got_grad - want_grad).abs().max() <= 1e-5 * want_grad.abs().max()


@pytest.mark.parametrize("length", [129, 193, 300])  # 129 and 193: a one-token tail, joined to the block before
def test_a_model_without_packed_rows_attends_in_query_blocks_and_a_non_causal_call_stays_so(length):
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=512, head_dim=8)  # grouped-query
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa")
    ids = torch.randint(3, 96, (2, length))
    want = model(input_ids=ids).logits
    assert attention.use_packed_attention(model)
    attention.query_blocks.cache_clear()
    with torch.inference_mode():  # masks first made here must still serve a training step
        assert torch.allclose(model(input_ids=ids).logits, want, rtol=1e-5, atol=1e-5)
    assert attention.query_blocks.cache_info().currsize == 1  # head_dim 8: blocks of 64
    assert all(end - start >= 32 for start, end, _ in attention.query_blocks(length, 64))
    model(input_ids=ids, labels=ids).loss.backward()
    q, k, v = (torch.randn(1, 2, 256, 8) for _ in range(3))
    full, _ = attention.packed_sdpa(Layer(), q, k, v, None, is_causal=False)
    assert torch.allclose(full.transpose(1, 2), torch.nn.functional.scaled_dot_product_attention(q, k, v), atol=1e-6)
