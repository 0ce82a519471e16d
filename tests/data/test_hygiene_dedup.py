"""Exact and near-duplicate removal (within and across sources), decontamination, resume."""
from __future__ import annotations

import pickle
import random

import numpy as np
import pytest

from forge.data import keyindex
from forge.data.dedup import MinHashLSH, WordHasher, lsh_params, shingles, words
from forge.data.hygiene import Hygiene, HygieneConfig
from forge.data.keyindex import BloomFilter, CompactIndex, SpillIndex
from forge.errors import ForgeError

_VOCAB = [f"w{i}" for i in range(3000)]


def doc(seed: int, n: int = 120) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(_VOCAB) for _ in range(n))


def edit(text: str, n_changes: int, seed: int = 0) -> str:
    rng = random.Random(seed)
    toks = text.split()
    for i in rng.sample(range(len(toks)), n_changes):
        toks[i] = "edited"
    return " ".join(toks)


def run(h: Hygiene, source: str, texts: list[str]) -> list[int]:
    return [n for n, _ in h.process(source, enumerate(texts, 1))]


def test_exact_duplicates_within_a_source():
    h = Hygiene(HygieneConfig(dedup="exact", pii="off"))
    kept = run(h, "a", ["one two three", "one  two\tthree ", "One two three", "four", "one two three"])
    assert kept == [1, 3, 4]  # whitespace-only changes are exact copies; case is not
    assert h.stats.exact_dups == 2 and h.stats.near_dups == 0 and h.stats.records_out == 3


def test_near_duplicate_removed_unrelated_kept():
    base = doc(1)
    light = edit(base, 1, seed=1) + " (updated)"  # Jaccard of 5-word shingles 0.91
    texts = [base, light, doc(2), edit(base, 14, seed=2)]  # the last one: Jaccard 0.39
    h = Hygiene(HygieneConfig(pii="off"))
    assert run(h, "a", texts) == [1, 3, 4]  # the light edit goes; a heavy edit and a new text stay
    assert h.stats.near_dups == 1 and h.stats.exact_dups == 0
    # exact-only mode keeps the lightly edited copy
    h = Hygiene(HygieneConfig(dedup="exact", pii="off"))
    assert run(h, "a", texts) == [1, 2, 3, 4]
    h = Hygiene(HygieneConfig(dedup="off", pii="off"))
    assert run(h, "a", texts + [base]) == [1, 2, 3, 4, 5]


def test_threshold_is_configurable():
    base = doc(3, 200)
    copy = edit(base, 12, seed=3)  # Jaccard of 5-word shingles 0.59
    assert run(Hygiene(HygieneConfig(pii="off", near_threshold=0.95)), "a", [base, copy]) == [1, 2]
    assert run(Hygiene(HygieneConfig(pii="off", near_threshold=0.4)), "a", [base, copy]) == [1]


def test_duplicates_across_sources_counted_per_source():
    base, other = doc(4), doc(5)
    h = Hygiene(HygieneConfig(pii="off"))
    assert run(h, "wiki", [base, other]) == [1, 2]
    assert run(h, "crm", [doc(6), base, edit(other, 1)]) == [1]
    s = h.stats.as_dict()
    assert s["hygiene.exact_dups"] == 1 and s["hygiene.near_dups"] == 1
    assert s["hygiene.source.crm.exact_dups"] == 1 and s["hygiene.source.crm.near_dups"] == 1
    assert s["hygiene.source.wiki.dropped"] == 0 and s["hygiene.source.crm.records_out"] == 1


def test_minhash_estimates_jaccard():
    lsh, wh, errors = MinHashLSH(0.8, 128), WordHasher(), []
    for seed in range(40):
        a = doc(100 + seed, 150)
        b = edit(a, seed % 25, seed=seed)
        sa, sb = shingles(wh(words(a)), 5), shingles(wh(words(b)), 5)
        true = len(set(sa.tolist()) & set(sb.tolist())) / len(set(sa.tolist()) | set(sb.tolist()))
        errors.append((lsh.signature(sa) == lsh.signature(sb)).mean() - true)
    errors = np.abs(errors)
    assert errors.max() < 0.15 and errors.mean() < 0.05  # std of the estimate is ~sqrt(J(1-J)/128)


def test_lsh_bands_put_the_s_curve_at_the_threshold():
    b, r = lsh_params(0.8, 128)
    assert (b, r) == (14, 9)
    p = lambda s: 1 - (1 - s**r) ** b  # noqa: E731
    # recall-leaning: candidates are verified, so near-threshold pairs should become candidates
    assert p(0.85) > 0.95 and p(0.8) > 0.8 and p(0.4) < 0.01


def test_compact_index_survives_merges():
    idx = CompactIndex()
    keys = np.random.default_rng(0).integers(0, 2**64 - 1, size=70_000, dtype=np.uint64)
    for i in range(0, len(keys), 1000):
        idx.insert(keys[i:i + 1000], i)
    assert len(idx) == 70_000 and len(idx._buf) < 70_000  # a merge into sorted arrays happened
    assert idx.lookup(keys[[0, 999, 1000, 69_999]]).tolist() == [0, 0, 1000, 69_000]
    assert idx.lookup(np.array([12345], dtype=np.uint64)).tolist() == [-1]


# ------------------------------------------------------------------ decontamination

EVAL = ("Which treatment is recommended first for adult acute lymphoblastic leukemia in patients "
        "older than sixty years with no prior chemotherapy exposure")


def test_decontamination_drops_13_gram_overlaps():
    words13 = EVAL.split()[3:16]
    texts = [
        "Background. " + " ".join(words13).upper() + "! and more words follow here",  # case/punct differ
        "Unrelated text about " + " ".join(words13[:12]) + " only twelve words shared",
        "Nothing in common at all with the evaluation questions whatsoever today",
    ]
    h = Hygiene(HygieneConfig(pii="off"), eval_texts=[EVAL])
    assert run(h, "a", texts) == [2, 3]
    assert h.stats.contaminated == 1 and h.stats.as_dict()["hygiene.contaminated"] == 1
    assert h.eval_ngrams == len(EVAL.split()) - 13 + 1

    h5 = Hygiene(HygieneConfig(pii="off", ngram=5), eval_texts=[EVAL])
    assert run(h5, "a", texts) == [3]
    off = Hygiene(HygieneConfig(pii="off", ngram=0), eval_texts=[EVAL])
    assert run(off, "a", texts) == [1, 2, 3]


def test_short_eval_texts_match_whole():
    short = "what are the side effects of proton therapy"  # 8 words < 13
    h = Hygiene(HygieneConfig(pii="off"), eval_texts=[short, "yes", "no"])
    kept = run(h, "a", ["Q: What are the side effects of proton therapy? A: fatigue",
                        "what are the side effects of chemotherapy", "yes no yes"])
    assert kept == [2, 3] and h.stats.contaminated == 1


# ------------------------------------------------------------------ resume

def test_state_dict_resume_matches_an_uninterrupted_run():
    base = [doc(i, 60) for i in range(30)]
    texts = base + [edit(t, 1, seed=i) for i, t in enumerate(base[:10])] + base[10:20] + [doc(99)]
    random.Random(0).shuffle(texts)
    cfg = HygieneConfig(pii="off")
    whole = Hygiene(cfg)
    expected = list(whole.process("a", enumerate(texts, 1)))

    first = Hygiene(cfg)
    got = list(first.process("a", enumerate(texts[:25], 1)))
    state = pickle.loads(pickle.dumps(first.state_dict()))
    assert all(isinstance(v, (int, str, bytes, dict)) for v in state.values())
    resumed = Hygiene(cfg)
    resumed.load_state_dict(state)
    got += list(resumed.process("a", enumerate(texts[25:], 26)))
    assert got == expected
    assert resumed.stats.as_dict() == whole.stats.as_dict()

    with pytest.raises(ForgeError, match="same hygiene settings"):
        Hygiene(HygieneConfig(pii="off", near_threshold=0.7)).load_state_dict(state)


def test_minhash_signatures_spill_to_disk_with_identical_decisions():
    """Kept signatures beyond the current chunk live in an unlinked temp file, so RAM holds one
    chunk of them however many records pass; decisions and saved state equal the in-RAM index."""
    rng = np.random.default_rng(3)
    base = rng.integers(0, 2**32, size=(3 * MinHashLSH._CHUNK + 100, 128), dtype=np.uint32)
    sigs = np.concatenate([base, base[::7].copy()])  # every 7th repeated: near-duplicate hits
    sigs[len(base):, :10] += 1                        # ... agreeing on 118/128 positions
    spilled, in_ram = MinHashLSH(0.8, 128), MinHashLSH(0.8, 128, spill=False)
    assert [spilled.seen_or_add(s) for s in sigs] == [in_ram.seen_or_add(s) for s in sigs]
    assert sum(c is not None for c in spilled._chunks) == 1 and all(c is not None for c in in_ram._chunks)
    assert spilled.state() == in_ram.state()
    again = MinHashLSH(0.8, 128)
    again.load(spilled.state())
    assert sum(c is not None for c in again._chunks) == 1
    assert [again.seen_or_add(s) for s in sigs[-50:]] == [True] * 50


# ------------------------------------------------------------------ bounded memory

def test_spill_index_moves_keys_to_disk_and_answers_like_a_dict(tmp_path):
    """Past `ram_keys` the keys move to SQLite under spill_dir; answers equal a plain dict's, the
    first value inserted for a key wins, and the folder goes with the index."""
    keys = np.random.default_rng(1).integers(0, 2**64 - 1, size=5_000, dtype=np.uint64, endpoint=True)
    keys[-3:] = [0, 2**63, 2**64 - 1]  # the signed/unsigned edges of SQLite's INTEGER
    idx, ref = SpillIndex(ram_keys=700, spill_dir=tmp_path), {}
    for i in range(0, len(keys), 250):
        part = keys[i:i + 250]
        new = part[idx.lookup(part) < 0]
        idx.insert(np.unique(new), i)
        for k in new.tolist():
            ref.setdefault(k, i)
    assert idx.spilled and len(idx) == len(ref) and len(idx._ram) <= 700
    assert len(list(tmp_path.glob("forge-dedup-*/index.db"))) == 1
    probe = np.concatenate([keys[::37], np.array([12345, 2**64 - 2], dtype=np.uint64)])
    assert idx.lookup(probe).tolist() == [ref.get(k, -1) for k in probe.tolist()]
    assert [idx.get(k) for k in probe.tolist()[:20]] == [ref.get(k, -1) for k in probe.tolist()[:20]]
    got_keys, got_vals = idx.items()
    assert got_keys.tolist() == sorted(ref) and got_vals.tolist() == [ref[k] for k in sorted(ref)]
    del idx
    assert not list(tmp_path.iterdir())


def test_bloom_filter_has_no_false_negatives_and_few_false_positives():
    rng = np.random.default_rng(2)
    added, other = rng.integers(0, 2**63, size=(2, 50_000), dtype=np.uint64) * np.uint64(2) + np.uint64(1)
    bloom = BloomFilter(bits_log2=20)
    bloom.add(added)
    assert bloom.maybe(added).all()
    assert bloom.maybe(other).mean() < 0.02  # 4 probes, 50k keys in 1M bits: ~0.2% expected


def test_spilled_hygiene_makes_the_same_decisions(monkeypatch, tmp_path):
    """Exact and near dedup with indexes forced to spill after 100 keys drop exactly
    the records an all-in-memory run drops, and resume from their state the same way."""
    base = [doc(i, 60) for i in range(150)]
    texts = base + [edit(t, 1, seed=i) for i, t in enumerate(base[:40])] + base[40:70]
    random.Random(1).shuffle(texts)
    cfg = HygieneConfig(pii="off")
    in_ram = Hygiene(cfg)
    expected = run(in_ram, "a", texts)
    monkeypatch.setattr(keyindex, "RAM_KEYS", 100)
    spilled = Hygiene(cfg, spill_dir=tmp_path)
    assert run(spilled, "a", texts) == expected
    assert spilled._near._buckets.spilled and spilled._exact._index.spilled
    assert spilled.stats == in_ram.stats and spilled.stats.exact_dups == 30 and spilled.stats.near_dups > 20
    resumed = Hygiene(cfg, spill_dir=tmp_path)
    resumed.load_state_dict(spilled.state_dict())
    assert run(resumed, "a", base[:5] + [doc(999, 60)]) == [6]
