"""Packing: best-fit blocks, restarting position ids, efficiency, and packed == unpacked loss."""
from __future__ import annotations

import random

import pytest
import torch

from forge.data.examples import sft_examples
from forge.data.formats import FormatSpec, FormatStats
from forge.data.packing import (
    collate,
    pack_best_fit,
    pack_next_fit,
    pack_stream,
    packing_efficiency,
    pad_batches,
)
from forge.train.losses import masked_lm_loss, masked_lm_loss_sum


def _mean_loss(model, batch):
    return masked_lm_loss(model, batch)

PAD = 3


def fake(lengths, seed=0):
    """Examples with distinct token values so each can be found again inside a block."""
    out = []
    for i, n in enumerate(lengths):
        ids = [1000 * (i + 1) + t for t in range(n)]
        out.append({"input_ids": ids, "labels": [-100] + ids[1:]})
    return out


def test_blocks_hold_whole_examples_with_restarting_positions():
    examples = fake([5, 9, 3, 7, 2, 6])
    blocks = pack_best_fit(examples, 16, PAD)
    assert all(len(b[k]) == 16 for b in blocks for k in ("input_ids", "labels", "position_ids"))
    seen = []
    for b in blocks:
        start = 0
        for n in b["lengths"]:
            assert b["position_ids"][start:start + n] == list(range(n))
            assert b["labels"][start] == -100
            ids = b["input_ids"][start:start + n]
            assert ids[0] % 1000 == 0 and ids == list(range(ids[0], ids[0] + n))  # whole and in order
            assert b["labels"][start + 1:start + n] == ids[1:]
            seen.append(ids[0] // 1000 - 1)
            start += n
        assert b["input_ids"][start:] == [PAD] * (16 - start) and set(b["labels"][start:]) <= {-100}
    assert sorted(seen) == list(range(len(examples)))
    assert [b["lengths"] for b in blocks] == [[9, 7], [6, 5, 3, 2]] and packing_efficiency(blocks) == 1.0
    assert packing_efficiency(pack_next_fit(examples, 16, PAD)) == 32 / 48  # [5, 9] [3, 7, 2] [6]


def test_best_fit_beats_sequential_packing_and_padding():
    rng = random.Random(0)
    examples = fake([rng.randint(3, 200) for _ in range(400)])
    best, naive = pack_best_fit(examples, 256, PAD), pack_next_fit(examples, 256, PAD)
    assert sum(sum(b["lengths"]) for b in best) == sum(len(e["input_ids"]) for e in examples)
    assert packing_efficiency(best) >= packing_efficiency(naive)
    assert packing_efficiency(best) > 0.97 and len(best) < len(naive)
    _, padded = pad_batches(examples, 8, PAD)
    assert packing_efficiency(best) > padded
    windows = list(pack_stream(examples, 256, PAD, window=100))
    assert sum(sum(b["lengths"]) for b in windows) == sum(len(e["input_ids"]) for e in examples)
    assert packing_efficiency(naive) <= packing_efficiency(windows) <= packing_efficiency(best)


def test_pad_batches_efficiency_and_masks():
    batches, eff = pad_batches(fake([4, 2, 3]), 2, PAD)
    assert [tuple(b["input_ids"].shape) for b in batches] == [(2, 4), (1, 3)]
    assert batches[0]["attention_mask"].tolist() == [[1, 1, 1, 1], [1, 1, 0, 0]]
    assert batches[0]["labels"][1].tolist()[2:] == [-100, -100]
    assert eff == pytest.approx(9 / 11)


def test_too_long_example_is_rejected():
    with pytest.raises(ValueError, match="too_long"):
        pack_best_fit(fake([20]), 16, PAD)


@pytest.fixture(scope="module")
def sft_data(tiny_checkpoint):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_checkpoint)
    rng = random.Random(1)
    words = "the cat sat on a mat and then it ran far away from home to see the sea".split()
    rows = []
    for i in range(14):
        q = " ".join(rng.choices(words, k=rng.randint(2, 12)))
        a = " ".join(rng.choices(words, k=rng.randint(1, 25)))
        rows.append((i + 1, f"mem:line {i + 1}", {"prompt": q + "?", "completion": a + "."}))
    examples = list(sft_examples(rows, tok, FormatSpec("prompt_completion"), 96, "mem", FormatStats()))
    return tok, examples


def tiny_model(vocab: int, attn: str):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, intermediate_size=64, max_position_embeddings=256,
                      attn_implementation=attn)
    return LlamaForCausalLM(cfg).float().eval()


@pytest.mark.slow
@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_packed_and_unpacked_losses_are_equal(sft_data, attn):
    tok, examples = sft_data
    model = tiny_model(len(tok), attn)
    blocks = pack_best_fit(examples, 256, tok.pad_token_id)
    assert len(blocks) < len(examples) and sum(len(b["lengths"]) > 2 for b in blocks) >= 2
    with torch.no_grad():
        one = [masked_lm_loss_sum(model, {"input_ids": torch.tensor([e["input_ids"]]),
                                    "labels": torch.tensor([e["labels"]])}) for e in examples]
        ref = sum(s for s, _ in one) / sum(n for _, n in one)
        packed = _mean_loss(model, collate(blocks))
        padded_parts = [masked_lm_loss_sum(model, b) for b in pad_batches(examples, 4, tok.pad_token_id)[0]]
        padded = sum(s for s, _ in padded_parts) / sum(n for _, n in padded_parts)
        # control: the same blocks with positions running on (one causal sequence per block) differ
        batch = collate(blocks)
        batch["position_ids"] = torch.arange(256).expand(len(blocks), -1)
        leaky = _mean_loss(model, batch)
    n_labels = sum(sum(x != -100 for x in e["labels"]) for e in examples)
    assert sum(n for _, n in one) == n_labels
    assert abs(packed.item() - ref.item()) < 1e-5, (packed.item(), ref.item())
    assert abs(padded.item() - ref.item()) < 1e-5
    assert abs(leaky.item() - ref.item()) > 5e-4


@pytest.mark.slow
def test_packed_gradients_match_unpacked(sft_data):
    tok, examples = sft_data
    model = tiny_model(len(tok), "sdpa").train()
    loss = _mean_loss(model, collate(pack_best_fit(examples, 256, tok.pad_token_id)))
    loss.backward()
    packed = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    sums = [masked_lm_loss_sum(model, {"input_ids": torch.tensor([e["input_ids"]]), "labels": torch.tensor([e["labels"]])})
            for e in examples]
    (sum(s for s, _ in sums) / sum(n for _, n in sums)).backward()
    for a, p in zip(packed, model.parameters()):
        assert torch.allclose(a, p.grad, atol=1e-6)
