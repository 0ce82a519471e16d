"""Data preparation in worker processes: on fuzzed sources with planted exact and near duplicates,
PII and contamination, the kept records, the cleaned cache and the counts are those of one streaming
Hygiene, at 1, 2 and 3 workers; bad records and refusals are raised as the streaming pass raises them."""
from __future__ import annotations

import gzip
import json
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, given, settings, strategies as st

from forge.data import parallel
from forge.data.cleanshards import clean_in_shards
from forge.data.dedup import NgramIndex
from forge.data.hygiene import Hygiene, HygieneConfig
from forge.data.parallel import Engine, PrepareConfig
from forge.data.prepare import clean_sources
from forge.errors import ForgeError
from forge.inputs import resolve_source
from forge.recipe import DataSource

WORDS = [f"w{i}" for i in range(40)] + ["pump", "valve", "ticket", "reset", "the", "a"]


@pytest.fixture
def engines():
    with Engine(2) as two, Engine(3) as three:
        yield {1: Engine(1), 2: two, 3: three}


@pytest.fixture
def small_shards(monkeypatch):
    monkeypatch.setattr(parallel, "SHARD_BYTES", 300)  # a few records a shard: many shards, several files
    monkeypatch.setattr(parallel, "BATCH_CHARS", 300)


def _docs(draw, n: int) -> list[str]:
    docs: list[str] = []
    for i in range(n):
        kind = draw(st.sampled_from(["new", "new", "new", "exact", "near", "pii", "empty"]))
        long = [d for d in docs if len(d.split()) >= 12]
        if kind == "exact" and docs:
            docs.append("  ".join(draw(st.sampled_from(docs)).split(" ")))  # whitespace-only change
        elif kind == "near" and long:
            toks = draw(st.sampled_from(long)).split()
            toks[draw(st.integers(0, len(toks) - 1))] = draw(st.sampled_from(WORDS))
            docs.append(" ".join(toks))
        elif kind == "pii":
            docs.append(f"mail {draw(st.sampled_from(['ann', 'bob']))}{i}@acme.com about " +
                        " ".join(draw(st.lists(st.sampled_from(WORDS), min_size=3, max_size=20))))
        elif kind == "empty":
            docs.append("!! ??")  # no words: no shingles
        else:
            docs.append(" ".join(draw(st.lists(st.sampled_from(WORDS), min_size=1, max_size=40))))
    return docs


@st.composite
def corpora(draw):
    docs = _docs(draw, draw(st.integers(1, 60)))
    cut = draw(st.integers(0, len(docs)))
    cfg = HygieneConfig(pii=draw(st.sampled_from(["redact", "drop", "off"])),
                        dedup=draw(st.sampled_from(["near", "near", "exact", "off"])),
                        near_threshold=draw(st.sampled_from([0.5, 0.8])), shingle_size=draw(st.sampled_from([2, 3, 5])),
                        num_perm=32, ngram=6, decontam_min_ngram=4, decontaminate_against=("ev",))
    evals = [" ".join(draw(st.sampled_from(docs)).split()[:7])] if docs and draw(st.booleans()) else ["x y"]
    return {"a": docs[:cut], "b": docs[cut:]}, evals, cfg, draw(st.booleans())


def _write(folder: Path, name: str, docs: list[str], files: int = 2) -> DataSource:
    """`docs` over `files` JSONL files (blank lines between some records), read as one source."""
    (folder / name).mkdir()
    per = -(-len(docs) // files) if docs else 1
    for f in range(files):
        part = docs[f * per:(f + 1) * per]
        (folder / name / f"{f}.jsonl").write_text("".join(json.dumps({"text": t}) + ("\n\n" if i % 5 == 4 else "\n")
                                                          for i, t in enumerate(part)))
    return DataSource(path=str(folder / name))


def _streaming(cfg, sources, todo):
    evals = (t for n in cfg.decontaminate_against for _, t in sources[n].records())
    h = Hygiene(cfg, evals)
    return {n: list(h.process(n, sources[n].records())) for n in todo}, h.stats.as_dict()


def _sharded(cfg, sources, todo, folder: Path, engine: Engine):
    index = NgramIndex((t for n in cfg.decontaminate_against for _, t in sources[n].records()), cfg.ngram,
                       cfg.decontam_min_ngram)
    out, spill = folder / f"out{engine.workers}", folder / f"spill{engine.workers}"
    out.mkdir()
    spill.mkdir()
    stats = clean_in_shards(cfg, sources, todo, index if len(index) else None, out, spill, engine)
    cache = {n: (out / f"{n}.jsonl").read_bytes() for n in todo}
    kept = {n: [(r["record"], r["text"]) for r in map(json.loads, cache[n].decode().splitlines())] for n in todo}
    return kept, stats.as_dict(), cache


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])
@given(corpora())
def test_kept_records_cache_and_counts_do_not_depend_on_workers(tmp_path, engines, small_shards, case):
    docs, evals, cfg, gz = case
    folder = Path(tempfile.mkdtemp(dir=tmp_path))
    cfgs = {"a": _write(folder, "a", docs["a"]), "b": _write(folder, "b", docs["b"], files=1),
            "ev": _write(folder, "ev", evals, 1)}
    if gz:  # a source workers cannot split by bytes: read here, shipped as record batches
        path = folder / "b" / "0.jsonl"
        (folder / "b" / "0.jsonl.gz").write_bytes(gzip.compress(path.read_bytes()))
        path.unlink()
    sources = {n: resolve_source(n, c, folder) for n, c in cfgs.items()}
    expected, expected_stats = _streaming(cfg, sources, ["a", "b"])
    caches = []
    for n, engine in engines.items():
        kept, stats, cache = _sharded(cfg, sources, ["a", "b"], folder, engine)
        assert kept == expected, f"{n} worker(s)"
        assert stats == expected_stats, f"{n} worker(s)"
        caches.append(cache)
    assert caches[0] == caches[1] == caches[2]


def test_planted_duplicates_are_found_across_shards_and_sources(tmp_path, engines, small_shards):
    base = " ".join(WORDS[:30])
    near = base.replace("w7", "w39")
    docs = [base] + [f"filler {i} " + " ".join(WORDS[i:i + 9]) for i in range(30)] + [near, base, "reach a@b.com"]
    sources = {"a": resolve_source("a", _write(tmp_path, "a", docs[:20]), tmp_path),
               "b": resolve_source("b", _write(tmp_path, "b", docs[20:]), tmp_path)}
    cfg = HygieneConfig(num_perm=64, shingle_size=3)
    kept, stats, _ = _sharded(cfg, sources, ["a", "b"], tmp_path, engines[3])
    assert stats["hygiene.exact_dups"] == 1 and stats["hygiene.near_dups"] == 1 and stats["hygiene.pii.email"] == 1
    assert [t for _, t in kept["b"]][-1] == "reach <EMAIL>"
    assert base not in [t for _, t in kept["b"]] and near not in [t for _, t in kept["b"]]
    assert len(parallel.file_shards(sources["a"])) > 3  # the duplicates crossed shards and sources


def test_clean_sources_cache_is_the_same_at_one_and_three_workers(tmp_path, small_shards):
    docs = [f"ticket {i % 10} " + " ".join(WORDS[i % 10:i % 10 + 12]) for i in range(80)]
    src = {"crm": resolve_source("crm", _write(tmp_path, "crm", docs), tmp_path)}
    fps = {"crm": src["crm"].fingerprint()}
    one, s1 = clean_sources(HygieneConfig(), src, ["crm"], fps, tmp_path / "w1", PrepareConfig(workers=1))
    three, s3 = clean_sources(HygieneConfig(), src, ["crm"], fps, tmp_path / "w3", PrepareConfig(workers=3))
    assert one["crm"].files[0].name == three["crm"].files[0].name  # one cache key whatever the workers
    assert one["crm"].files[0].parent.name == three["crm"].files[0].parent.name
    assert one["crm"].files[0].read_bytes() == three["crm"].files[0].read_bytes() and s1 == s3
    assert s1["hygiene.exact_dups"] > 0


def _fresh(root: Path, name: str) -> Path:
    (root / name).mkdir()
    return root / name


@pytest.mark.parametrize("workers", [1, 3])
def test_refusals_name_the_first_bad_record_in_order(tmp_path, engines, small_shards, workers):
    docs = [f"line {i} " + " ".join(WORDS[i:i + 10]) for i in range(40)]
    cfg = _write(tmp_path, "a", docs, files=1)
    path = tmp_path / "a" / "0.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    lines[30] = "{not json\n"
    lines[35] = '"a string"\n'
    path.write_text("".join(lines))
    src = {"a": resolve_source("a", cfg, tmp_path)}
    with pytest.raises(ForgeError) as streaming:
        _streaming(HygieneConfig(), src, ["a"])
    with pytest.raises(ForgeError) as sharded:
        _sharded(HygieneConfig(), src, ["a"], tmp_path, engines[workers])
    assert str(sharded.value) == str(streaming.value) and f"{path}:line 31: malformed JSON" in str(sharded.value)
    # on_error: skip: the bad records are counted; max_errors=1 refuses at the second, as streaming does
    skip = {"a": resolve_source("a", cfg.model_copy(update={"on_error": "skip", "max_errors": 1}), tmp_path)}
    with pytest.raises(ForgeError, match=r"more than max_errors=1 bad records .*line 36: expected a JSON object"):
        _sharded(HygieneConfig(), skip, ["a"], _fresh(tmp_path, "x"), engines[workers])
    # pii: fail refuses at the first finding, naming the record, never the value
    lines[30], lines[35] = json.dumps({"text": "write to z@q.com"}) + "\n", json.dumps({"text": "k"}) + "\n"
    path.write_text("".join(lines))
    with pytest.raises(ForgeError) as streaming:
        _streaming(HygieneConfig(pii="fail"), src, ["a"])
    with pytest.raises(ForgeError, match=r"record 26: found 1 PII/secret finding\(s\) of type email") as e:
        _sharded(HygieneConfig(pii="fail"), src, ["a"], _fresh(tmp_path, "y"), engines[workers])
    assert str(e.value) == str(streaming.value) and "z@q.com" not in str(e.value)  # line 31: record 26


def _all_blocks(sources, tok, split="train"):
    from forge.data.mixing import build_mixture, eval_mixture

    mix = build_mixture(sources, {"a": 0.7, "b": 0.3}, tok, 16, "eos", max_repeats=0, on_exhausted="rebalance") \
        if split == "train" else eval_mixture(sources, {"a": 0.7, "b": 0.3}, tok, 16, "eos")
    out = []
    while (block := mix.next_block()) is not None:
        out.append(block)
    return out


@settings(max_examples=3, deadline=None, phases=[Phase.generate], suppress_health_check=[
    HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(st.lists(st.lists(st.sampled_from(WORDS + ["Ünï", "\n", "42,", "!"]), max_size=30).map(" ".join),
                min_size=2, max_size=40), st.integers(0, 40))
def test_token_ids_and_mixed_blocks_do_not_depend_on_workers(tmp_path, tiny_checkpoint, small_shards, monkeypatch,
                                                             docs, cut):
    from dataclasses import replace

    from transformers import AutoTokenizer

    from forge.data import tokencache

    monkeypatch.setattr(tokencache, "CACHE_BYTES", 0)
    tok = AutoTokenizer.from_pretrained(tiny_checkpoint)
    folder = Path(tempfile.mkdtemp(dir=tmp_path))
    head = ["alpha w1 w2", "beta w3", "gamma w4 w5 w6"]  # a's first records: some train, some held out
    plain = {"a": resolve_source("a", _write(folder, "a", head + docs[:cut]).model_copy(update={"holdout": 0.2}),
                                 folder),
             "b": resolve_source("b", _write(folder, "b", docs[cut:] + ["tail"], files=1), folder)}
    expected = _all_blocks(plain, tok), _all_blocks(plain, tok, "eval")
    for workers in (1, 2, 3):
        cached = {n: replace(s, token_dir=folder / f"tok{workers}", workers=workers) for n, s in plain.items()}
        assert (_all_blocks(cached, tok), _all_blocks(cached, tok, "eval")) == expected, f"{workers} worker(s)"
        assert len([p for p in (folder / f"tok{workers}").glob("tokens-a-*") if p.is_dir()]) == 1  # encoded once
