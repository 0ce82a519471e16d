"""Token ids of a source, encoded once in worker processes and kept on disk: the mixture then cuts its
blocks from them instead of encoding as it trains. A shard's documents are encoded exactly as
`forge.data.blocks.EncodedDocs` encodes them (a batch of short ones, a long one window by window), so
the ids, and the blocks, are the same whatever the number of workers, and the same as without a cache.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np

from forge.data.head_encode import HeadCutter
from forge.data.parallel import BATCH_CHARS, Engine, Shard, file_shards, record_shards
from forge.data.sources import Source
from forge.errors import ForgeError
from forge.files import atomic_dir

ENCODE_BATCH = 512
WINDOW_CHARS = 1 << 20  # a longer document is encoded a window at a time: memory follows the window


class Encoder:
    """Documents to ids as the mixture encodes them: the Rust tokenizer's batch encode (no special
    tokens), a long text in windows cut where no token spans (forge.data.head_encode)."""

    def __init__(self, tokenizer, window: int = WINDOW_CHARS):
        self.tokenizer, self.window = tokenizer, window
        backend = getattr(tokenizer, "backend_tokenizer", tokenizer if hasattr(tokenizer, "encode_batch_fast") else None)
        self.backend = backend if backend is not None and hasattr(backend, "encode_batch_fast") else None
        plain = backend is not None and getattr(backend, "padding", None) is None \
            and getattr(backend, "truncation", None) is None
        self.cutter = HeadCutter.for_tokenizer(backend) if plain else None

    def ids(self, texts: list[str]) -> list[list[int]]:
        # the Rust tokenizer directly: transformers' per-call wrapping costs ~10-40% of throughput
        if self.backend is not None:
            return [e.ids for e in self.backend.encode_batch_fast(texts, add_special_tokens=False)]
        return self.tokenizer(texts, add_special_tokens=False, verbose=False)["input_ids"] if texts else []

    def long(self, text: str) -> bool:
        return self.cutter is not None and len(text) > self.window

    def windows(self, text: str) -> Iterator[list[int]]:
        """A long text's ids, window by window; each window ends where no token of the whole text
        spans, so together they are the whole text's ids."""
        start = 0
        while start < len(text):
            end = self.cutter.cut(text, start + self.window, search=self.window) if self.cutter else None
            end = len(text) if end is None else end
            yield self.ids([text[start:end]])[0]
            start = end


def tokenizer_digest(tokenizer) -> str:
    """What the ids depend on: the tokenizer's own JSON (or its name and vocabulary size)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    text = backend.to_str() if backend is not None else f"{type(tokenizer).__name__}:{len(tokenizer)}"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _source_key(source: Source) -> dict:
    files = [(str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in source.files]
    return {"files": files, "format": source.format, "text_fields": source.text_fields, "split": source.split,
            "hub": source.hub, "hub_split": source.hub_split, "revision": source.hub_revision,
            "data_files": source.hub_data_files, "max_records": source.max_records,
            "max_tokens": source.max_tokens, "on_error": source.on_error, "chat": repr(source.chat)}


CACHE_BYTES = 8 << 20  # a smaller source is encoded as it is read (its cache would save little)


def worth_caching(source: Source) -> bool:
    """A source with a cache folder, of files big enough, whose bad records fail (skipped ones are
    counted as the mixture reads them) gets a token cache."""
    return source.token_dir is not None and source.on_error == "fail" and source.hub is None \
        and source.size_bytes >= CACHE_BYTES


@dataclass(frozen=True)
class Encode:
    shard: Shard
    tokenizer: object
    out: str


def encode_shard(task: Encode) -> int:
    """A worker's part: the shard's non-empty documents as ids (flat), their offsets and record numbers
    (a byte range counts its records from 1; the parent renumbers). Returns the records read."""
    shard, enc = task.shard, Encoder(task.tokenizer)
    records: list[int] = []
    pieces: list[np.ndarray] = []
    lengths: list[int] = []
    batch: list[tuple[int, str]] = []
    read = 0

    def flush() -> None:
        short = [t for _, t in batch if not enc.long(t)]
        encoded = iter(enc.ids(short))
        for number, text in batch:
            ids = np.concatenate([np.asarray(w, np.uint32) for w in enc.windows(text)] or [np.empty(0, np.uint32)]) \
                if enc.long(text) else np.asarray(next(encoded), np.uint32)
            records.append(number)
            pieces.append(ids)
            lengths.append(len(ids))
        batch.clear()

    items = shard.records if shard.records is not None else _texts(shard)
    for read, (number, text) in enumerate(items, start=1):  # noqa: B007  (read: the count, returned below)
        if text:
            batch.append((number, text))
            if len(batch) == ENCODE_BATCH:
                flush()
    flush()
    np.save(task.out + ".ids.npy", np.concatenate(pieces) if pieces else np.empty(0, np.uint32))
    np.save(task.out + ".offsets.npy", np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)]))
    np.save(task.out + ".records.npy", np.array(records, dtype=np.int64))
    return read


def _texts(shard: Shard) -> Iterator[tuple[int, str]]:
    """A byte range's records, numbered from 1 (a bad record fails or is skipped as `records` does)."""
    source = shard.source
    for n, (path, line, item) in enumerate(shard.items(), start=1):
        try:
            yield n, source.text_of(path, line, item)
        except ForgeError as e:
            source.skip(path, line, e)  # on_error: skip counts it here; fail raises, named


class TokenCache:
    """A source's cached ids: `docs()` yields (record number, ids) in record order (memory-mapped)."""

    def __init__(self, folder: Path):
        self.folder = folder
        meta = json.loads((folder / "meta.json").read_text())
        self.shards, self.bases = meta["shards"], meta["bases"]

    def docs(self) -> Iterator[tuple[int, np.ndarray]]:
        for i in range(self.shards):
            ids = np.load(self.folder / f"{i}.ids.npy", mmap_mode="r")
            offsets = np.load(self.folder / f"{i}.offsets.npy")
            records = np.load(self.folder / f"{i}.records.npy") + self.bases[i]
            for k, record in enumerate(records.tolist()):
                yield record, ids[offsets[k]:offsets[k + 1]]


def token_cache(source: Source, tokenizer, folder: Path, workers: int) -> TokenCache:
    """The source's TokenCache under `folder` (keyed by its files, reader settings and tokenizer),
    encoded now by `workers` processes when it is not there yet."""
    key = hashlib.sha256(json.dumps([_source_key(source), tokenizer_digest(tokenizer)]).encode()).hexdigest()[:16]
    cache = folder / f"tokens-{source.name}-{key}"
    if (cache / "meta.json").is_file():
        return TokenCache(cache)
    folder.mkdir(parents=True, exist_ok=True)
    # every training process builds its mixture: one encodes, the others wait for it and read its cache
    with open(folder / f"{cache.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (cache / "meta.json").is_file():
            _build(source, tokenizer, cache, workers)
    return TokenCache(cache)


def _build(source: Source, tokenizer, cache: Path, workers: int) -> None:
    with atomic_dir(cache) as tmp, Engine(workers) as engine:
        shards = file_shards(source, workers) if source.splittable else record_shards(source)
        total = len(shards) if isinstance(shards, list) else max(1, -(-source.size_bytes // BATCH_CHARS))
        kinds: list[bool] = []
        # a worker gets the Rust tokenizer alone when there is one (it loads without transformers)
        fast = Encoder(tokenizer).backend or tokenizer

        def tasks() -> Iterator[Encode]:
            for shard in shards:
                kinds.append(shard.records is None)
                yield Encode(shard, fast, str(tmp / str(len(kinds) - 1)))

        reads = list(engine.map(encode_shard, tasks(), f"data: tokenizing {source.name} by shard", total,
                                count=lambda n: n))
        bases, seen = [], 0
        for by_range, n in zip(kinds, reads):
            bases.append(seen if by_range else 0)
            seen += n
        (tmp / "meta.json").write_text(json.dumps({"shards": len(reads), "bases": bases}))
