"""Mixing by token share, repeats, held-out split and exact loader resume."""
from __future__ import annotations

import json

import pytest

from forge.data.mixing import build_mixture, eval_blocks, in_holdout
from forge.inputs import resolve_source
from forge.errors import ForgeError
from forge.recipe import DataSource


@pytest.fixture(scope="module")
def tokenizer(tiny_checkpoint):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_checkpoint)


@pytest.mark.parametrize("weights", [{"general": 0.3, "domain": 0.7}, {"general": 0.9, "domain": 0.1}])
def test_token_shares_match_weights(generated_sources, tokenizer, weights):
    mix = build_mixture(generated_sources, weights, tokenizer, 64, "eos")
    for _ in range(100):
        mix.next_batch(8)  # 51,200 tokens
    shares = mix.shares()
    assert sum(mix.taken.values()) == 100 * 8 * 64
    for name, w in weights.items():
        assert abs(shares[name] - w) <= 0.01, shares


def test_exhausted_source_repeats_and_counts(tmp_path, generated_sources, tokenizer):
    small = tmp_path / "small.jsonl"
    small.write_text("".join(json.dumps({"text": f"tiny document number {i}."}) + "\n" for i in range(20)))
    sources = {"small": resolve_source("small", DataSource(path=str(small)), tmp_path),
               "general": generated_sources["general"]}
    mix = build_mixture(sources, {"small": 0.5, "general": 0.5}, tokenizer, 32, "eos")
    for _ in range(40):
        mix.next_batch(4)
    assert mix.repeats()["small"] >= 5
    assert mix.repeats()["general"] == 0
    assert abs(mix.shares()["small"] - 0.5) <= 0.01


def test_blocks_are_packed_with_separators(generated_sources, tokenizer):
    mix = build_mixture({"general": generated_sources["general"]}, {"general": 1.0}, tokenizer, 64, "eos")
    batch = mix.next_batch(4)
    assert batch.shape == (4, 64)
    assert (batch == tokenizer.eos_token_id).sum() >= 1
    assert (batch != tokenizer.pad_token_id).all()  # no padding anywhere


def test_holdout_is_disjoint_and_fixed(generated_sources, tokenizer):
    held = [r for r in range(1, 301) if in_holdout("general", r, 0.1)]
    assert 10 <= len(held) <= 50
    assert held == [r for r in range(1, 301) if in_holdout("general", r, 0.1)]
    a = eval_blocks(generated_sources, {"general": 1, "domain": 1}, tokenizer, 32, "eos", 8)
    b = eval_blocks(generated_sources, {"general": 1, "domain": 1}, tokenizer, 32, "eos", 8)
    assert a.shape == (8, 32) and (a == b).all()


def test_resume_gives_the_same_tokens(generated_sources, tokenizer):
    weights = {"general": 0.4, "domain": 0.6}
    straight = build_mixture(generated_sources, weights, tokenizer, 48, "eos")
    for _ in range(30):
        straight.next_batch(4)
    state = straight.state_dict()
    expected = [straight.next_batch(4) for _ in range(30)]
    resumed = build_mixture(generated_sources, weights, tokenizer, 48, "eos")
    resumed.load_state_dict(json.loads(json.dumps(state)))  # survives a trip through JSON
    for want in expected:
        assert (resumed.next_batch(4) == want).all()


def test_ranks_split_the_single_process_stream(generated_sources, tokenizer):
    import torch

    one = build_mixture(generated_sources, {"general": 1.0}, tokenizer, 32, "eos").next_batch(4, 0, 2)
    two = build_mixture(generated_sources, {"general": 1.0}, tokenizer, 32, "eos").next_batch(4, 1, 2)
    alone = build_mixture(generated_sources, {"general": 1.0}, tokenizer, 32, "eos").next_batch(8)
    assert torch.equal(torch.cat([one, two]), alone)


def test_empty_source_is_an_error(tmp_path, tokenizer):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    sources = {"empty": resolve_source("empty", DataSource(path=str(empty)), tmp_path)}
    with pytest.raises(ForgeError, match="'empty' has no train documents"):
        build_mixture(sources, {"empty": 1.0}, tokenizer, 32, "eos").next_batch(1)


def test_shares_hold_over_a_million_tokens(generated_sources, tokenizer):
    weights = {"general": 0.35, "domain": 0.65}
    mix = build_mixture(generated_sources, weights, tokenizer, 256, "eos")
    for _ in range(62):
        mix.next_batch(64)  # 62 x 64 x 256 = 1,015,808 tokens, sources repeated many times
    assert sum(mix.taken.values()) >= 1_000_000
    assert all(abs(mix.shares()[k] - w) <= 0.01 for k, w in weights.items()), mix.shares()
    assert min(mix.repeats().values()) >= 10


def test_max_repeats_then_fail_names_the_source(tmp_path, generated_sources, tokenizer):
    small = tmp_path / "small.jsonl"
    small.write_text("".join(json.dumps({"text": f"short text {i}."}) + "\n" for i in range(10)))
    sources = {"small": resolve_source("small", DataSource(path=str(small)), tmp_path),
               "general": generated_sources["general"]}
    mix = build_mixture(sources, {"small": 0.5, "general": 0.5}, tokenizer, 32, "eos", max_repeats=2)
    with pytest.raises(ForgeError, match="'small' ran out after 2 repeat"):
        for _ in range(100):
            mix.next_batch(4)


def test_max_repeats_then_rebalance(tmp_path, generated_sources, tokenizer):
    small = tmp_path / "small.jsonl"
    small.write_text("".join(json.dumps({"text": f"short text {i}."}) + "\n" for i in range(10)))
    sources = {"small": resolve_source("small", DataSource(path=str(small)), tmp_path), **generated_sources}
    mix = build_mixture(sources, {"small": 0.2, "general": 0.2, "domain": 0.6}, tokenizer, 32, "eos",
                        max_repeats=1, on_exhausted="rebalance")
    for _ in range(100):
        mix.next_batch(4)
    assert mix.rebalanced == ["small"] and mix.repeats()["small"] == 1
    taken = mix.taken
    assert taken["small"] < 0.2 * sum(taken.values())
    assert abs(taken["general"] / (taken["general"] + taken["domain"]) - 0.25) <= 0.01  # the others keep their ratio


def test_fast_encode_path_matches_the_tokenizer_call(generated_sources, tokenizer):
    from forge.data.mixing import TokenStream

    stream = TokenStream(generated_sources["domain"], tokenizer, "eos", "train", repeat=False)
    texts = [t for _, t in generated_sources["domain"].records()][:50] + ["Ünïcödé  spaces\tand\nlines ✓"]
    slow = [x + [tokenizer.eos_token_id] for x in tokenizer(texts, add_special_tokens=False)["input_ids"]]
    assert stream._encode(texts) == slow
