"""Mixing by token share, repeats, held-out split and exact loader resume."""
from __future__ import annotations

import json
import threading

import pytest

from forge.data.mixing import build_mixture, eval_blocks, in_holdout
from forge.errors import ForgeError
from forge.inputs import resolve_source
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


def test_a_curated_sets_split_is_its_own_under_any_recipe_name(generated_sources, tokenizer):
    """Pretraining draws only the records the set holds in (Source.holdout_key), as SFT replay and
    the evaluation suite do, so the general perplexity check never scores text the stage trained on."""
    import dataclasses

    src = dataclasses.replace(generated_sources["general"], name="replay", split_key="general", holdout=0.2)
    mix = build_mixture({"replay": src}, {"replay": 1.0}, tokenizer, 32, "eos")
    for _ in range(40):
        mix.next_batch(4)
    trained = {record for _, record in mix.take_records()}
    assert trained and not any(in_holdout("general", r, 0.2) for r in trained)
    assert any(in_holdout("replay", r, 0.2) for r in trained)  # the recipe name's split would differ


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


def test_blocks_are_the_slow_tokenizer_calls_ids_joined_and_cut(tmp_path, tokenizer):
    """Blocks cut by numpy slices from the fast batch encode equal the plain tokenizer call's ids, each
    document's with its separator, joined and cut into seq_len blocks (after or before each document)."""
    texts = [f"record {i}: " + "Ünïcödé  spaces\tand\nlines ✓ " * (i % 7) for i in range(120)]
    path = tmp_path / "texts.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    src = {"t": resolve_source("t", DataSource(path=str(path), holdout=0.0), tmp_path)}
    slow = tokenizer(texts, add_special_tokens=False)["input_ids"]
    for sep, sep_id in (("eos", tokenizer.eos_token_id), ("bos", tokenizer.bos_token_id)):
        joined = [t for ids in slow for t in ((ids + [sep_id]) if sep == "eos" else ([sep_id] + ids))]
        mix = build_mixture(src, {"t": 1.0}, tokenizer, 24, sep, max_repeats=0, on_exhausted="rebalance")
        blocks = []
        while (block := mix.next_block()) is not None:
            blocks += block
        assert blocks == joined[:len(joined) // 24 * 24]


def _launch_sources(tmp_path, generated_sources, monkeypatch):
    """A token-cached source (the cache threshold lowered), one encoded as read, and a small one
    that runs out after one repeat."""
    from dataclasses import replace

    from forge.data import tokencache

    monkeypatch.setattr(tokencache, "CACHE_BYTES", 0)
    small = tmp_path / "small.jsonl"
    small.write_text("".join(json.dumps({"text": f"short text {i}."}) + "\n" for i in range(10)))
    return {"general": replace(generated_sources["general"], token_dir=tmp_path / "tokens", workers=2),
            "domain": generated_sources["domain"],
            "small": resolve_source("small", DataSource(path=str(small)), tmp_path)}


def test_each_rank_of_a_launch_cuts_only_its_own_blocks_of_the_one_stream(tmp_path, generated_sources, tokenizer,
                                                                           monkeypatch):
    """A launch plans its blocks once; rank r of 2 cuts only its own, which are exactly the blocks
    build_mixture gives rank r (tokens, order, records), with the same counts after every batch."""
    import torch

    from forge.data.blocks import Ranks
    from forge.data.mixing import Mix, launch_mixture

    sources = _launch_sources(tmp_path, generated_sources, monkeypatch)
    weights = {"general": 0.5, "domain": 0.3, "small": 0.2}
    mix = Mix(weights, 32, "eos", max_repeats=1, on_exhausted="rebalance")
    steps, per_rank = 40, 3
    ranks = [launch_mixture(sources, mix, tokenizer, steps * per_rank * 2, Ranks(tmp_path / "blocks", r, 2))
             for r in range(2)]
    assert len(list((tmp_path / "blocks").glob("blocks-*"))) == 1  # planned once: rank 1 found rank 0's layout
    alone = build_mixture(sources, weights, tokenizer, 32, "eos", max_repeats=1, on_exhausted="rebalance")
    for _ in range(steps):
        want, records = alone.next_batch(2 * per_rank), alone.take_records()
        got = [m.next_batch(per_rank, r, 2) for r, m in enumerate(ranks)]
        assert torch.equal(torch.cat(got), want)
        assert ranks[0].take_records() + ranks[1].take_records() == records
        for m in ranks:
            assert (m.taken, m.repeats(), m.rebalanced, m.shares()) == \
                (alone.taken, alone.repeats(), alone.rebalanced, alone.shares())
    assert alone.rebalanced == ["small"]  # the rebalance really happened inside the launch
    assert [m.read for m in ranks] == [steps * per_rank] * 2  # each cut its own share, nothing more


def test_a_launch_resumes_from_its_block_count_without_planning_again(tmp_path, generated_sources, tokenizer,
                                                                       monkeypatch):
    from forge.data import blocks as layout
    from forge.data.blocks import Ranks
    from forge.data.mixing import Mix, launch_mixture

    sources = _launch_sources(tmp_path, generated_sources, monkeypatch)
    mix, ranks = Mix({"general": 0.4, "domain": 0.4, "small": 0.2}, 48, "bos"), Ranks(tmp_path / "blocks", 1, 2)
    launch_mixture(sources, mix, tokenizer, 240, Ranks(tmp_path / "blocks"))  # rank 0 plans
    straight = launch_mixture(sources, mix, tokenizer, 240, ranks)
    for _ in range(10):
        straight.next_batch(4, 1, 2)
    state = json.loads(json.dumps(straight.state_dict()))
    expected = [straight.next_batch(4, 1, 2) for _ in range(20)]
    monkeypatch.setattr(layout, "write_layout", lambda *a: pytest.fail("planned again"))
    resumed = launch_mixture(sources, mix, tokenizer, 240, Ranks(tmp_path / "blocks"))
    resumed.load_state_dict(state)
    assert all((resumed.next_batch(4, 1, 2) == want).all() for want in expected)
    assert resumed.read == 20 * 4 and resumed.taken == straight.taken
    with pytest.raises(ForgeError, match="drew more than the 240 blocks"):
        resumed.next_batch(4, 1, 2)
    with pytest.raises(ForgeError, match="written by an earlier forge"):
        resumed.load_state_dict({"taken": {}, "rebalanced": [], "streams": {}})  # the per-source format


def test_a_launch_that_runs_out_fails_on_every_rank_with_the_sources_name(tmp_path, generated_sources, tokenizer,
                                                                           monkeypatch):
    from forge.data.blocks import Ranks
    from forge.data.mixing import Mix, launch_mixture

    sources = _launch_sources(tmp_path, generated_sources, monkeypatch)
    mix = Mix({"small": 0.5, "general": 0.5}, 32, "eos", max_repeats=2)
    barrier, errors = threading.Barrier(2, timeout=120), {}

    def rank_(rank: int) -> None:  # rank 0 plans and fails; rank 1, past the barrier, reads why
        try:
            launch_mixture(sources, mix, tokenizer, 400, Ranks(tmp_path / "out" / "blocks", rank, 2, barrier.wait))
        except ForgeError as e:
            errors[rank] = str(e)

    threads = [threading.Thread(target=rank_, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(errors) == [0, 1] and all("'small' ran out after 2 repeat" in e for e in errors.values()), errors
    assert not (tmp_path / "out").exists()  # no layout, no note: the folders it made are gone
