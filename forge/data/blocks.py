"""Packed blocks as a layout planned from documents' lengths, and cut from the token ids afterwards.

A block is a list of pieces, each `length` tokens of one document (its ids with the separator) from
`start`. Which source a piece comes from follows the deficit rule (forge.data.mixing) and depends on
lengths alone, so `Planner` lays blocks out without copying a token, and `cut` fills a block with a
few numpy slices. A training launch plans its blocks once (`prepare`: rank 0 writes the layout into
a folder every rank reads, the others wait at the launch's barrier), then each rank cuts only its
own blocks: from the token cache's memory maps, or, for a source encoded as it is read, from the ids
rank 0 stored beside the layout. The layout is stored, not the blocks: 48 bytes a piece (a few a
block) instead of 4 bytes a token, and the part that copies tokens runs on every rank at once.
"""
from __future__ import annotations

import json
import os
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Callable, Iterator, Protocol, Sequence

import numpy as np

from forge.data.sources import Source
from forge.data.tokencache import WINDOW_CHARS, Encoder, TokenCache
from forge.errors import ForgeError
from forge.files import atomic_dir

ENCODE_BATCH = 512
WINDOW_TOKENS = WINDOW_CHARS // 4  # a cached document longer than this is taken a window at a time
SHIFT = 1 << 40  # a cached document's reference: shard * SHIFT + the offset of its first id in the shard
Piece = tuple[int, int, int, int, int, int]  # source, document, its length, start, tokens, record number
FLUSH = 1024  # blocks a launch's planner buffers before it appends them to the layout's files


class Split(Protocol):
    """Which documents of a source a stream reads (forge.data.mixing: the stable held-out split)."""

    name: str  # train or eval

    def keep(self, record: int) -> bool: ...
    def mask(self, records: np.ndarray) -> np.ndarray: ...


class Chunk:
    """Segments of consecutive documents, as parallel lists: a piece never crosses a segment (a short
    document's ids with the separator are one; a long one's windows and its separator are each one)."""

    def __init__(self) -> None:
        self.lens: list[int] = []
        self.docs: list[int] = []
        self.doc_lens: list[int] = []
        self.starts: list[int] = []
        self.records: list[int] = []

    def add(self, doc: int, n: int, record: int, windows: Sequence[int] | None, sep_after: bool) -> None:
        """One document of `n` ids: short (`windows` None), or long, taken a window at a time (the
        windows' lengths; the separator is a segment of its own)."""
        if windows is None:
            self.lens.append(n + 1)
            self.starts.append(0)
            count = 1
        else:
            at, count = 0, 0
            for size in ([1, *windows] if not sep_after else [*windows, 1]):
                if size:  # an empty window gives no piece
                    self.lens.append(size)
                    self.starts.append(at)
                    count += 1
                at += size
        self.docs += [doc] * count
        self.doc_lens += [n] * count
        self.records += [record] * count


class CachedDocs:
    """A token-cached source (forge.data.tokencache): planned from its shards' offsets, cut from its
    ids' memory maps."""

    def __init__(self, folder: Path):
        self.cache = TokenCache(Path(folder))
        self._maps: dict[int, np.ndarray] = {}

    def chunks(self, split: Split, sep_after: bool) -> Iterator[Chunk]:
        folder = self.cache.folder
        for i in range(self.cache.shards):
            offsets = np.load(folder / f"{i}.offsets.npy")
            records = np.load(folder / f"{i}.records.npy") + self.cache.bases[i]
            lens = np.diff(offsets)
            keep = np.flatnonzero((lens > 0) & split.mask(records))
            if not len(keep):
                continue
            chunk, lens, docs, records = Chunk(), lens[keep], i * SHIFT + offsets[keep], records[keep]
            if int(lens.max()) <= WINDOW_TOKENS:  # short documents only: one segment each
                chunk.lens, chunk.docs, chunk.doc_lens = (lens + 1).tolist(), docs.tolist(), lens.tolist()
                chunk.starts, chunk.records = [0] * len(keep), records.tolist()
            else:
                for doc, n, record in zip(docs.tolist(), lens.tolist(), records.tolist()):
                    windows = [min(WINDOW_TOKENS, n - s) for s in range(0, n, WINDOW_TOKENS)] \
                        if n > WINDOW_TOKENS else None
                    chunk.add(doc, n, record, windows, sep_after)
            yield chunk

    def ids(self, doc: int, n: int) -> np.ndarray:
        shard, offset = divmod(doc, SHIFT)
        ids = self._maps.get(shard)
        if ids is None:  # a plain view of the memory map: slicing it skips np.memmap's Python hooks
            ids = self._maps[shard] = np.load(self.cache.folder / f"{shard}.ids.npy", mmap_mode="r").view(np.ndarray)
        return ids[offset:offset + n]


class EncodedDocs:
    """A source encoded as it is read (no token cache): a batch of short documents at a time, a long
    one window by window (forge.data.tokencache.Encoder), again each epoch. A document's reference is
    the offset of its ids among all this source's encoded ids; they are kept in memory until
    `release`d, or appended to `sink` (a file beside a launch's layout) when there is one."""

    def __init__(self, source: Source, encoder: Encoder, sink: BinaryIO | None = None):
        self.source, self.encoder, self.sink = source, encoder, sink
        self.cutter = encoder.cutter
        self.held: OrderedDict[int, np.ndarray] = OrderedDict()
        self.at = 0

    def chunks(self, split: Split, sep_after: bool) -> Iterator[Chunk]:
        batch: list[tuple[int, str]] = []
        for record, text in self.source.records():
            if len(text) and split.keep(record):
                batch.append((record, text))
                if len(batch) == ENCODE_BATCH:
                    yield self._encode(batch, sep_after)
                    batch = []
        if batch:
            yield self._encode(batch, sep_after)

    def _encode(self, batch: list[tuple[int, str]], sep_after: bool) -> Chunk:
        enc, chunk = self.encoder, Chunk()
        short = iter(enc.ids([t for _, t in batch if not enc.long(t)]))
        for record, text in batch:
            if enc.long(text):
                windows = [np.asarray(w, np.uint32) for w in enc.windows(text)]
                ids = np.concatenate(windows) if windows else np.empty(0, np.uint32)
                sizes: list[int] | None = [len(w) for w in windows]
            else:
                ids = np.asarray(next(short), np.uint32)
                sizes = None
            chunk.add(self.at, len(ids), record, sizes, sep_after)
            if self.sink is not None:
                self.sink.write(ids.tobytes())
            else:
                self.held[self.at] = ids
            self.at += len(ids)
        return chunk

    def ids(self, doc: int, n: int) -> np.ndarray:
        return self.held[doc]

    def release(self, before: int) -> None:
        """Forget the ids of documents before `before` (blocks past them are cut already)."""
        while self.held and next(iter(self.held)) < before:
            self.held.popitem(last=False)


class StoredDocs:
    """The ids a launch's rank 0 encoded for a source without a token cache, read back by any rank."""

    def __init__(self, path: Path):
        self.map = np.memmap(path, np.uint32, "r").view(np.ndarray) if path.stat().st_size else np.empty(0, np.uint32)

    def ids(self, doc: int, n: int) -> np.ndarray:
        return self.map[doc:doc + n]


class Stream:
    """One source's documents of one split as the planner takes them: pieces of the current segment,
    the next document when it is used up, and the next epoch (a repeat) when the source is, while
    `repeat` and `max_repeats` allow; else it is exhausted. Documents are read as they are needed."""

    def __init__(self, docs, name: str, split: Split, repeat: bool, sep_after: bool,
                 max_repeats: int | None = None):
        self.docs, self.name, self.split, self.repeat, self.sep_after = docs, name, split, repeat, sep_after
        self.max_repeats = max_repeats
        self.epoch, self.repeats, self.exhausted = 0, 0, False
        self._cutter = getattr(docs, "cutter", None)  # a source encoded as read: its long-text window cutter
        self._chunks = docs.chunks(split, sep_after)
        self._chunk, self._i, self._seen = Chunk(), 0, 0
        self.rem = 0  # tokens left in the current segment
        self.doc = self.doc_len = self.start = self.record = self.at = 0

    def take(self, room: int) -> int:
        """Up to `room` tokens of the current segment (the next one when it is used up): their document
        is `doc` (`doc_len` ids, record number `record`) from `at`. 0 when the source has no more."""
        if not self.rem and not self._next():
            return 0
        n = room if room < self.rem else self.rem
        self.at = self.start
        self.start += n
        self.rem -= n
        return n

    def _next(self) -> bool:
        while self._i >= len(self._chunk.lens):
            if not self._fill():
                return False
        c, i = self._chunk, self._i
        self._i += 1
        self.rem, self.doc, self.doc_len, self.start, self.record = c.lens[i], c.docs[i], c.doc_lens[i], c.starts[i], c.records[i]
        return True

    def _fill(self) -> bool:
        chunk = next(self._chunks, None)
        if chunk is not None:
            self._chunk, self._i = chunk, 0
            self._seen += 1
            return True
        if self._seen == 0 and self.split.name == "train":
            raise ForgeError(f"data source {self.name!r} has no {self.split.name} documents")
        if not self.repeat or (self.max_repeats is not None and self.repeats >= self.max_repeats):
            self.exhausted = True
            return False
        self.epoch += 1
        self.repeats += 1
        self._chunks, self._seen = self.docs.chunks(self.split, self.sep_after), 0
        return True

    def release(self) -> None:
        if isinstance(self.docs, EncodedDocs):
            self.docs.release(self.doc)


class Planner:
    """The deficit rule: each piece of a block comes from the source whose share of the tokens so far
    lags its weight the most (the first such, in the mixture's order), among the sources still drawing.
    A source that runs out past its repeats fails the mixture (`on_exhausted: fail`) or leaves it, the
    others sharing its weight in proportion to their own (`rebalance`)."""

    def __init__(self, streams: list[Stream], weights: dict[str, float], seq_len: int, on_exhausted: str = "fail"):
        total = sum(weights.values())
        self.streams, self.seq_len, self.on_exhausted = streams, seq_len, on_exhausted
        self.weights = [weights[s.name] / total for s in streams]
        self.taken = [0] * len(streams)
        self.rebalanced: list[tuple[int, str]] = []  # (block, source) of each source dropped past max_repeats
        self.blocks = 0  # blocks planned

    def block(self) -> list[Piece] | None:
        """The next block's pieces, or None when the sources still drawing cannot fill it."""
        streams, weights, taken = self.streams, self.weights, self.taken
        pieces: list[Piece] = []
        room = self.seq_len
        active = [i for i, s in enumerate(streams) if not s.exhausted]
        total, seen = sum(weights[i] for i in active), sum(taken[i] for i in active)
        while room and active:
            pick = active[0]
            if len(active) > 1:
                best = weights[pick] / total * seen - taken[pick]
                for i in active[1:]:
                    lag = weights[i] / total * seen - taken[i]
                    if lag > best:
                        best, pick = lag, i
            stream = streams[pick]
            n = stream.take(room)
            if not n:
                self._drop(stream)
                active.remove(pick)
                total, seen = sum(weights[i] for i in active), sum(taken[i] for i in active)
                continue
            pieces.append((pick, stream.doc, stream.doc_len, stream.at, n, stream.record))
            taken[pick] += n
            seen += n
            room -= n
        self.blocks += 1
        return None if room else pieces

    def _drop(self, stream: Stream) -> None:
        if stream.repeat and self.on_exhausted == "fail":
            raise ForgeError(
                f"data source {stream.name!r} ran out after {stream.repeats} repeat(s) (max_repeats "
                f"{stream.max_repeats}); raise max_repeats, add data, or set on_exhausted: rebalance")
        if stream.repeat:  # rebalance: the others share its weight from here on
            self.rebalanced.append((self.blocks, stream.name))


def cut(pieces: Sequence[Piece], docs: Sequence, seq_len: int, sep: tuple[int, bool]) -> np.ndarray:
    """A block's ids from its pieces: each a slice of its document's ids, the separator (after, or
    before, each document) put where the piece covers it."""
    sep_id, after = sep
    out = np.empty(seq_len, np.int64)
    at = 0
    for source, doc, length, start, n, _ in pieces:
        ids = docs[source].ids(doc, length)
        if after:
            if start + n > length:
                out[at:at + length - start] = ids[start:]
                out[at + n - 1] = sep_id
            else:
                out[at:at + n] = ids[start:start + n]
        elif start:
            out[at:at + n] = ids[start - 1:start - 1 + n]
        else:
            out[at] = sep_id
            out[at + 1:at + n] = ids[:n - 1]
        at += n
    return out


def spans(pieces: Sequence[Piece], names: Sequence[str]) -> list[tuple[str, int]]:
    """(source, record number) of a block's pieces, a record once while consecutive pieces share it."""
    out: list[tuple[str, int]] = []
    for source, _, _, _, _, record in pieces:
        if (names[source], record) not in out[-1:]:
            out.append((names[source], record))
    return out


@dataclass(frozen=True)
class Ranks:
    """Where a launch's ranks share its prepared blocks (one folder all of them read: on several nodes,
    a shared file system), which rank this is, and the launch's barrier."""

    folder: Path
    rank: int = 0
    world: int = 1
    wait: Callable[[], None] = lambda: None


def prepare(ranks: Ranks, key: str, plan: Callable[[Path], None]) -> Path:
    """The layout folder `blocks-KEY` under `ranks.folder`: rank 0 plans it (`plan(tmp)` fills a
    temporary folder that then appears whole) unless an earlier launch did; the other ranks wait at the
    barrier. A ForgeError while planning is every rank's error: rank 0 leaves it in `blocks-KEY.failed`
    for the others, and once they have read it removes it and the folders it made, so a run that failed
    on its data leaves its output folder as it found it."""
    path, failed = ranks.folder / f"blocks-{key}", ranks.folder / f"blocks-{key}.failed"
    if ranks.rank == 0 and not (path / "meta.json").is_file():
        made = [d for d in (ranks.folder, *ranks.folder.parents) if not d.exists()]  # deepest first
        ranks.folder.mkdir(parents=True, exist_ok=True)
        failed.unlink(missing_ok=True)
        try:
            with atomic_dir(path) as tmp:
                plan(tmp)
        except Exception as e:  # the others are at the barrier: tell them why, then fail here too
            message = str(e) if isinstance(e, ForgeError) else f"rank 0 failed to plan the blocks: {type(e).__name__}: {e}"
            partial = failed.with_name(failed.name + ".partial")
            partial.write_text(message)
            os.replace(partial, failed)
            ranks.wait()  # the others read why
            if ranks.world > 1:
                ranks.wait()  # ... and have read it
            _remove(failed, made)
            raise
    ranks.wait()
    if not (path / "meta.json").is_file():
        if not failed.is_file():
            raise ForgeError(f"the prepared blocks {path} are missing (a multi-node launch needs a shared filesystem)")
        message = failed.read_text()
        ranks.wait()  # rank 0 removes the note once every rank has read it
        raise ForgeError(message)
    return path


def _remove(failed: Path, made: list[Path]) -> None:
    failed.unlink(missing_ok=True)
    for folder in made:
        try:
            folder.rmdir()
        except OSError:  # something else lives there now
            return


def write_layout(folder: Path, planner: Planner, blocks: int, meta: dict) -> None:
    """Plan `blocks` blocks into `folder`: pieces.bin (int64 rows: source, document, its length,
    start, tokens, record number), bounds.bin (block b's pieces are rows bounds[b]:bounds[b+1]),
    counts.bin (per block, tokens taken and repeats per source after it) and meta.json."""
    width = len(planner.streams)
    bounds, rows, counts = [0], [], []
    with open(folder / "pieces.bin", "wb") as p, open(folder / "counts.bin", "wb") as c:
        for b in range(blocks):
            pieces = planner.block()
            if pieces is None:
                raise ForgeError("the data ran out before the stage's token budget was met")
            rows += pieces
            bounds.append(bounds[-1] + len(pieces))
            counts.append(planner.taken + [s.repeats for s in planner.streams])
            if len(counts) == FLUSH or b == blocks - 1:
                np.asarray(rows, np.int64).reshape(-1, 6).tofile(p)
                np.asarray(counts, np.int64).reshape(-1, 2 * width).tofile(c)
                rows, counts = [], []
    np.asarray(bounds, np.int64).tofile(folder / "bounds.bin")
    (folder / "meta.json").write_text(json.dumps({**meta, "blocks": blocks, "rebalanced": planner.rebalanced}))


def _read(path: Path, dtype, width: int = 1) -> np.ndarray:
    if not path.stat().st_size:
        return np.empty((0, width), dtype) if width > 1 else np.empty(0, dtype)
    data = np.memmap(path, dtype, "r").view(np.ndarray)
    return data.reshape(-1, width) if width > 1 else data


class Layout:
    """A launch's planned blocks as a rank reads them: a block's pieces, the counts after any block."""

    def __init__(self, path: Path):
        self.meta = json.loads((path / "meta.json").read_text())
        self.names: list[str] = self.meta["names"]
        self.blocks: int = self.meta["blocks"]
        self.pieces = _read(path / "pieces.bin", np.int64, 6)
        self.bounds = _read(path / "bounds.bin", np.int64)
        self.counts = _read(path / "counts.bin", np.int64, 2 * len(self.names))
        self.docs = [CachedDocs(Path(d["cache"])) if "cache" in d else StoredDocs(path / d["store"])
                     for d in self.meta["docs"]]

    def block(self, b: int) -> list[list[int]]:
        """Block b's pieces, as rows of Piece."""
        return self.pieces[self.bounds[b]:self.bounds[b + 1]].tolist()

    def taken(self, done: int) -> dict[str, int]:
        """Tokens taken per source by the first `done` blocks."""
        row = self.counts[done - 1, :len(self.names)].tolist() if done else [0] * len(self.names)
        return dict(zip(self.names, row))

    def repeats(self, done: int) -> dict[str, int]:
        row = self.counts[done - 1, len(self.names):].tolist() if done else [0] * len(self.names)
        return dict(zip(self.names, row))

    def rebalanced(self, done: int) -> list[str]:
        return [name for block, name in self.meta["rebalanced"] if block < done]
