"""Hygiene in shards with the output of one streaming `Hygiene` over the sources in order, whatever
the number of workers: (1) each shard is read, PII/secret-scanned, decontaminated and redacted in a
worker, which keeps its surviving texts, their exact digests and MinHash signatures on disk; (2) exact
duplicates: digests partitioned by hash, all but the first holder of each dropped; (3) band keys of
the rest partitioned by hash, each partition returning the keys that several records hold; (4) here,
in record order, the streaming rule on those few records only: a record is a near duplicate when the
first kept holder of one of its keys has a signature within the threshold (a record that shares no
key is kept without a look); (5) each shard writes its kept records, and the parts are joined.
"""
from __future__ import annotations

import json
import math
import shutil
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import Iterator

import numpy as np

from forge.data.dedup import ExactIndex, MinHashLSH, NgramIndex, WordHasher, shingles, words
from forge.data.hygiene import PII_TYPES, Hygiene, HygieneConfig, HygieneStats
from forge.data.parallel import BATCH_CHARS, Engine, Shard, file_shards, peak_mb, record_shards, shard_count
from forge.data.sources import Source
from forge.errors import ForgeError

PARTITION_BYTES = 256 << 20  # source bytes per hash partition of the dedup keys


@dataclass(frozen=True)
class Screen:
    """One shard's task: hygiene without dedup, writing what dedup needs under `prefix`."""

    shard: Shard
    cfg: HygieneConfig
    ngrams: str | None  # an NgramIndex of the evaluation texts, saved as .npz
    prefix: str
    parts: int


@dataclass
class Screened:
    items: int                         # records read (numbering: a byte-range shard counts from 1)
    rows: int                          # records that survived PII and decontamination
    stats: dict                        # HygieneStats.to_state()
    skips: list                        # (position, path, line, message) of bad records
    error: tuple[int, str] | None      # (position, message): the shard's first refusal
    peak_mb: float = 0.0               # the worker's peak resident memory so far


@lru_cache(maxsize=2)
def _ngrams(path: str) -> NgramIndex:
    return NgramIndex.load(path)


def screen(task: Screen) -> Screened:
    """Phase 1 in a worker: the shard's surviving texts (one JSON string a line) and, per row, its
    record number, exact digest and signature; digests and band keys also by hash partition."""
    cfg, shard, source = task.cfg, task.shard, task.shard.source
    h = Hygiene(replace(cfg, dedup="off"), ngrams=_ngrams(task.ngrams) if task.ngrams else None)
    lsh = MinHashLSH(cfg.near_threshold, cfg.num_perm, spill=False) if cfg.dedup == "near" else None
    hasher, pos, skips = WordHasher(), [0], []

    def records() -> Iterator[tuple[int, str]]:
        if shard.records is not None:
            for pos[0], rec in enumerate(shard.records, start=1):
                yield rec
            return
        for pos[0], (path, line, item) in enumerate(shard.items(), start=1):
            try:
                yield pos[0], source.text_of(path, line, item)
            except ForgeError as e:
                if source.on_error != "skip":
                    raise
                skips.append((pos[0], str(path), line, str(e)))

    numbers, digests, sigs, has = [], [], [], []
    error = None
    with open(task.prefix + ".texts", "w", encoding="utf-8") as out:
        try:
            for number, text in h.process(source.name, records()):
                out.write(json.dumps(text) + "\n")
                numbers.append(number)
                if cfg.dedup != "off":
                    digests.append(ExactIndex.key(text))
                if lsh is not None:
                    sh = shingles(hasher(words(text)), cfg.shingle_size)
                    has.append(len(sh) > 0)
                    sigs.append(lsh.signature(sh) if len(sh) else np.zeros(cfg.num_perm, np.uint32))
        except ForgeError as e:  # a bad record (on_error: fail) or a PII finding (pii: fail)
            error = (pos[0], str(e))
    np.save(task.prefix + ".number.npy", np.array(numbers, dtype=np.int64))
    _save_parts(task, np.array(digests, dtype=np.uint64), "d", np.arange(len(digests)))
    if lsh is not None:
        sig = np.stack(sigs) if sigs else np.empty((0, cfg.num_perm), np.uint32)
        np.save(task.prefix + ".sig.npy", sig)
        rows = np.flatnonzero(np.array(has, dtype=bool))
        keys = lsh.band_keys(sig[rows]) if len(rows) else np.empty((0, lsh.bands), np.uint64)
        _save_parts(task, keys.ravel(), "k", np.repeat(rows, lsh.bands))
    state = h.stats.sources.get(source.name, HygieneStats(pii=dict(h.stats.pii))).to_state()
    return Screened(pos[0], len(numbers), state, skips, error, peak_mb())


def _save_parts(task: Screen, keys: np.ndarray, tag: str, rows: np.ndarray) -> None:
    part = keys % np.uint64(task.parts)
    for p in range(task.parts):
        mine = part == p
        np.save(f"{task.prefix}.{tag}{p}.npy", np.stack([keys[mine], rows[mine].astype(np.uint64)], axis=1))


def _holders(prefixes: list[str], offsets: np.ndarray, tag: str, p: int) -> tuple[np.ndarray, np.ndarray]:
    """A partition's (key, global row) pairs from every shard, sorted by key then row."""
    keys, rows = [np.empty(0, np.uint64)], [np.empty(0, np.int64)]
    for prefix, off in zip(prefixes, offsets):
        a = np.load(f"{prefix}.{tag}{p}.npy")
        keys.append(a[:, 0])
        rows.append(a[:, 1].astype(np.int64) + off)
    k, r = np.concatenate(keys), np.concatenate(rows)
    order = np.lexsort((r, k))
    return k[order], r[order]


def exact_partition(args: tuple[list[str], np.ndarray, int]) -> np.ndarray:
    """Phase 2: the global rows whose digest an earlier row holds."""
    k, r = _holders(*args[:2], "d", args[2])
    later = np.zeros(len(k), dtype=bool)
    later[1:] = k[1:] == k[:-1]
    return r[later]


def band_partition(args: tuple[list[str], np.ndarray, int, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Phase 3: the (key, row) pairs of keys that two or more rows hold, exact duplicates left out."""
    prefixes, offsets, p, exact = args
    k, r = _holders(prefixes, offsets, "k", p)
    keep = ~np.isin(r, exact)
    k, r = k[keep], r[keep]
    shared = np.zeros(len(k), dtype=bool)
    same = k[1:] == k[:-1]
    shared[1:] |= same
    shared[:-1] |= same
    return k[shared], r[shared]


def _near(pairs: list[tuple[np.ndarray, np.ndarray]], lsh: MinHashLSH, sig) -> np.ndarray:
    """Phase 4: the streaming rule over the rows that share a key, in row order."""
    k = np.concatenate([a for a, _ in pairs] + [np.empty(0, np.uint64)])
    r = np.concatenate([b for _, b in pairs] + [np.empty(0, np.int64)])
    order = np.lexsort((k, r))
    rows, keys = r[order].tolist(), k[order].tolist()
    first: dict[int, int] = {}  # key -> the first kept row that holds it
    near, i = [], 0
    while i < len(rows):
        row, mine = rows[i], []
        while i < len(rows) and rows[i] == row:
            mine.append(keys[i])
            i += 1
        held = dict.fromkeys(first[key] for key in mine if key in first)
        if any(lsh.similar(sig(j), sig(row)) for j in held):
            near.append(row)
        else:
            for key in mine:
                first.setdefault(key, row)
    return np.array(near, dtype=np.int64)


def write_part(args: tuple[str, int, np.ndarray, str]) -> int:
    """Phase 5: a shard's kept records as the cache's lines (record numbers of the source)."""
    prefix, offset, dropped, out = args
    numbers = np.load(prefix + ".number.npy").tolist()
    drop = np.zeros(len(numbers), dtype=bool)
    drop[dropped] = True
    kept = 0
    with open(prefix + ".texts", encoding="utf-8") as src, open(out, "w", encoding="utf-8") as dst:
        for row, line in enumerate(src):
            if not drop[row]:
                dst.write(f'{{"record": {numbers[row] + offset}, "text": {line[:-1]}}}\n')
                kept += 1
    return kept


def clean_in_shards(cfg: HygieneConfig, sources: dict[str, Source], todo: list[str], ngrams: NgramIndex | None,
                    out: Path, spill: Path, engine: Engine) -> HygieneStats:
    """Write `out/<name>.jsonl` for each source in `todo` (see the module docstring); the counts."""
    total_bytes = sum(sources[n].size_bytes for n in todo if sources[n].hub is None)
    parts = max(1, min(256, math.ceil(total_bytes / PARTITION_BYTES)))
    index = None
    if ngrams is not None:
        index = str(spill / "ngrams.npz")
        ngrams.save(index)
    meta: list[tuple[str, Source, bool]] = []  # (source name, source, read by byte range) per shard
    failed: list[ForgeError] = []

    def tasks() -> Iterator[Screen]:
        for name in todo:
            try:
                for shard in _shards(sources[name], engine.workers):
                    meta.append((name, sources[name], shard.records is None))
                    yield Screen(shard, cfg, index, str(spill / f"s{len(meta) - 1}"), parts)
            except ForgeError as e:  # read here: raised once the shards before it are checked
                failed.append(e)
                return

    results = list(engine.map(screen, tasks(), "data: hygiene (PII, secrets, decontamination) by shard",
                              _estimate(sources, todo, engine.workers), count=lambda r: r.items))
    _refuse(meta, results)
    clean_in_shards.peak_mb = max((r.peak_mb for r in results), default=0.0)  # for benchmarks: one worker's peak
    if failed:
        raise failed[0]
    prefixes = [str(spill / f"s{i}") for i in range(len(results))]
    offsets = np.cumsum([0] + [r.rows for r in results])[:-1]
    exact = near = np.empty(0, np.int64)
    if cfg.dedup != "off":
        exact = np.concatenate([np.empty(0, np.int64)] + list(engine.map(
            exact_partition, [(prefixes, offsets, p) for p in range(parts)], "data: exact duplicates by hash partition",
            parts)))
    if cfg.dedup == "near":
        lsh = MinHashLSH(cfg.near_threshold, cfg.num_perm, spill=False)
        pairs = list(engine.map(band_partition, [(prefixes, offsets, p, exact) for p in range(parts)],
                                "data: near duplicates by band-key partition", parts))
        near = _near(pairs, lsh, _Signatures(prefixes, offsets))
    return _write(cfg, meta, results, (prefixes, offsets, exact, near), out, engine)


def _shards(source: Source, workers: int) -> Iterator[Shard]:
    if source.splittable:
        yield from file_shards(source, workers)
    else:
        yield from record_shards(source)


def _estimate(sources: dict[str, Source], todo: list[str], workers: int) -> int:
    """The shards the sources will make (record batches: estimated from the bytes)."""
    return sum(sum(shard_count(p.stat().st_size, workers) for p in sources[n].files) if sources[n].splittable
               else max(1, math.ceil(sources[n].size_bytes / BATCH_CHARS)) for n in todo)


class _Signatures:
    """A global row's MinHash signature, read from its shard's file (memory-mapped)."""

    def __init__(self, prefixes: list[str], offsets: np.ndarray):
        self.offsets = offsets
        self.files = [np.load(p + ".sig.npy", mmap_mode="r") for p in prefixes]

    def __call__(self, row: int) -> np.ndarray:
        s = int(np.searchsorted(self.offsets, row, side="right")) - 1
        return np.asarray(self.files[s][row - self.offsets[s]])


def _refuse(meta: list[tuple[str, Source, bool]], results: list[Screened]) -> None:
    """Raise what the streaming pass would have raised first: bad records past max_errors, a bad
    record with on_error: fail, or a PII finding with pii: fail, in record order."""
    numbering: dict[str, int] = {}
    for (name, source, by_range), r in zip(meta, results):
        for at, path, line, message in r.skips:
            if r.error is not None and r.error[0] < at:
                break
            source.skip(path, line, ForgeError(message))
        base = numbering.get(name, 0) if by_range else 0
        numbering[name] = numbering.get(name, 0) + r.items
        if r.error is not None:  # a worker counts a byte range's records from 1: the source's number
            at = f"source {name!r}, record {r.error[0]}: "
            raise ForgeError(r.error[1].replace(at, f"source {name!r}, record {r.error[0] + base}: ", 1))


def _write(cfg: HygieneConfig, meta: list[tuple[str, Source, bool]], results: list[Screened], dedup: tuple,
           out: Path, engine: Engine) -> HygieneStats:
    """Phase 5 and the counts: each shard's part written (in the workers), then joined per source."""
    prefixes, offsets, exact, near = dedup
    dropped = np.union1d(exact, near)
    numbering: dict[str, int] = {}
    tasks = []
    for i, ((name, _, by_range), r) in enumerate(zip(meta, results)):
        base = numbering.get(name, 0) if by_range else 0  # records a worker read count from 1
        numbering[name] = numbering.get(name, 0) + r.items
        lo = offsets[i]
        tasks.append((prefixes[i], base, dropped[(dropped >= lo) & (dropped < lo + r.rows)] - lo, prefixes[i] + ".part"))
    list(engine.map(write_part, tasks, "data: writing the cleaned cache by shard", len(tasks)))
    stats = HygieneStats(pii=dict.fromkeys(cfg.pii_types or PII_TYPES, 0) if cfg.pii != "off" else {})
    for name, _, _ in meta:
        stats.sources.setdefault(name, HygieneStats(pii=dict(stats.pii)))
    for i, ((name, _, _), r) in enumerate(zip(meta, results)):
        lo, hi = offsets[i], offsets[i] + r.rows
        s = HygieneStats.from_state(r.stats)
        s.exact_dups = int(((exact >= lo) & (exact < hi)).sum())
        s.near_dups = int(((near >= lo) & (near < hi)).sum())
        s.records_out -= s.exact_dups + s.near_dups
        stats.sources[name].add(s)
    for s in list(stats.sources.values()):
        stats.add(s)
    for name in stats.sources:
        with open(out / f"{name}.jsonl", "wb") as dst:
            for (n, _, _), task in zip(meta, tasks):
                if n == name:
                    with open(task[3], "rb") as src:
                        shutil.copyfileobj(src, dst, 1 << 20)
    return stats
