"""Weighted mixing of sources by share of trained tokens, packed into fixed-length blocks.

Documents are tokenized in batches, joined with a separator (EOS after, or BOS before, each
document) and cut into `seq_len` blocks with no padding. Each piece of a block comes from the
source whose share of tokens so far lags its weight the most (a deficit rule, deterministic), so
every source's share of trained tokens matches its weight to within one piece over a run. A source
that runs out starts again from its first document and its repeat count goes up. The loader's
position in every source is a small state dict, saved with checkpoints, so a resumed run sees the
same tokens an uninterrupted one would.
"""
from __future__ import annotations

import hashlib
from collections import deque
from pathlib import Path
from typing import Iterator

import numpy as np
import torch

from forge.data.sources import Source
from forge.data.tokencache import WINDOW_CHARS, Encoder, token_cache, worth_caching
from forge.errors import ForgeError

ENCODE_BATCH = 512
WINDOW_CHARS = WINDOW_CHARS  # a longer document is encoded a window at a time: memory follows the window
WINDOW_TOKENS = WINDOW_CHARS // 4  # a cached document longer than this is read a slice at a time


def in_holdout(source: str, record: int, fraction: float) -> bool:
    """Stable split: a record is held out when its hash falls below `fraction` (no RNG state).
    It depends on the data alone, never on a stage's seed, so every stage holds out the same
    documents and no stage evaluates on what an earlier one trained on."""
    digest = hashlib.blake2b(f"holdout:{source}:{record}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64 < fraction


class TokenStream:
    """One source's documents, as token ids, for one split; optionally repeating forever. A source
    with a `token_dir` is encoded once, by its `workers` (forge.data.tokencache), and read from there."""

    def __init__(self, source: Source, tokenizer, separator: str, split: str, repeat: bool,
                 max_repeats: int | None = None):
        self.source, self.tokenizer, self.repeat, self.max_repeats = source, tokenizer, repeat, max_repeats
        self.split = split
        sep_id = tokenizer.eos_token_id if separator == "eos" else tokenizer.bos_token_id
        if sep_id is None:
            raise ForgeError(f"the tokenizer has no {separator.upper()} token; set the stage's separator to the other one")
        self.sep_id, self.sep_after = sep_id, separator == "eos"
        self.epoch, self.repeats, self.exhausted = 0, 0, False
        self._records: Iterator[tuple[int, str | np.ndarray]] = iter(())
        self._queue: deque[tuple[int, list[int] | str | np.ndarray]] = deque()
        self._cur: list[int] = []     # the tokens of the current document (or of its current window)
        self._pos = 0                  # position in _cur
        self._rest: Iterator[list[int]] | None = None  # a long document's windows still to encode
        self._cur_record, self._offset = 0, 0          # the document, and the tokens taken from it
        self._seen_in_epoch = 0
        self._enc = Encoder(tokenizer, WINDOW_CHARS)
        self._cutter = self._enc.cutter
        self._cache = None
        if worth_caching(source):
            self._cache = token_cache(source, tokenizer, Path(source.token_dir), source.workers)
        self._open()

    def _open(self) -> None:
        self._records = self._cache.docs() if self._cache is not None else iter(self.source.records())
        self._seen_in_epoch = 0

    def _wanted(self, record: int) -> bool:
        held = in_holdout(self.source.name, record, self.source.holdout)
        return held if self.split == "eval" else not held

    def _encode(self, texts: list[str]) -> list[list[int]]:
        ids = self._enc.ids(texts)
        if self.sep_after:
            return [x + [self.sep_id] for x in ids]
        return [[self.sep_id] + x for x in ids]

    def _long(self, doc: str | np.ndarray) -> bool:
        return len(doc) > WINDOW_TOKENS if isinstance(doc, np.ndarray) else self._enc.long(doc)

    def _windows(self, doc: str | np.ndarray) -> Iterator[list[int]]:
        """A long document's tokens, window by window (its text encoded a window at a time, or its
        cached ids taken a slice at a time), with the separator."""
        if not self.sep_after:
            yield [self.sep_id]
        if isinstance(doc, np.ndarray):
            for i in range(0, len(doc), WINDOW_TOKENS):
                yield doc[i:i + WINDOW_TOKENS].tolist()
        else:
            yield from self._enc.windows(doc)
        if self.sep_after:
            yield [self.sep_id]

    def _ready(self, docs: list[str | np.ndarray]) -> list:
        """Short documents as their ids with the separator (cached ones stay numpy: a block converts
        only its pieces); a long one stays as it is (cached ids in a 1-tuple) until it is read."""
        texts = iter(self._encode([d for d in docs if isinstance(d, str) and not self._long(d)]))
        sep = np.array([self.sep_id], dtype=np.int64)
        return [(d,) if isinstance(d, np.ndarray) and self._long(d) else d if isinstance(d, str) and self._long(d)
                else np.concatenate((d, sep) if self.sep_after else (sep, d)) if isinstance(d, np.ndarray)
                else next(texts) for d in docs]

    def _fill(self) -> bool:
        """Queue the next batch of encoded documents; False when the source has none left."""
        while not self._queue:
            batch: list[tuple[int, str]] = []
            for record, text in self._records:
                if self._wanted(record) and len(text):
                    batch.append((record, text))
                    if len(batch) == ENCODE_BATCH:
                        break
            if batch:
                self._seen_in_epoch += len(batch)
                self._queue.extend(zip((r for r, _ in batch), self._ready([t for _, t in batch])))
                return True
            if self._seen_in_epoch == 0 and self.split == "train":
                raise ForgeError(f"data source {self.source.name!r} has no {self.split} documents")
            if not self.repeat or (self.max_repeats is not None and self.repeats >= self.max_repeats):
                self.exhausted = True
                return False
            self.epoch += 1
            self.repeats += 1
            self._open()
        return True

    def take(self, n: int) -> list[int] | np.ndarray:
        """Up to `n` tokens from the current document (starting the next one when needed)."""
        while self._pos >= len(self._cur):
            window = next(self._rest, None) if self._rest is not None else None
            if window is not None:
                self._cur, self._pos = window, 0
                continue
            if not self._fill():
                return []
            self._cur_record, doc = self._queue.popleft()
            self._offset, self._pos = 0, 0
            if isinstance(doc, (list, np.ndarray)):  # ready: its ids with the separator
                self._cur, self._rest = doc, None
            else:  # a long document: its windows, one at a time
                self._cur, self._rest = [], self._windows(doc[0] if isinstance(doc, tuple) else doc)
        piece = self._cur[self._pos:self._pos + n]
        self._pos += len(piece)
        self._offset += len(piece)
        return piece

    @property
    def record(self) -> int:
        """The record number of the document the last piece came from."""
        return self._cur_record

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "repeats": self.repeats, "record": self._cur_record,
                "offset": self._offset, "exhausted": self.exhausted}

    def load_state_dict(self, state: dict) -> None:
        """Re-read the source up to the saved document and position inside it."""
        self.epoch, self.repeats, self.exhausted = state["epoch"], state["repeats"], state["exhausted"]
        self._queue.clear()
        self._open()
        self._cur, self._pos, self._rest, self._offset, self._cur_record = [], 0, None, 0, 0
        if state["record"] == 0:
            return
        for record, text in self._records:
            if record == state["record"]:
                self._seen_in_epoch = 1
                self._cur_record, self._offset = record, state["offset"]
                self._rest = self._windows(text) if self._long(text) else iter(self._ready([text]))
                skip = state["offset"]
                while (window := next(self._rest, None)) is not None:
                    if skip < len(window):
                        self._cur, self._pos = window, skip
                        break
                    skip -= len(window)
                return
        raise ForgeError(f"data source {self.source.name!r} changed since the checkpoint: record {state['record']} is gone")


class MixedBlocks:
    """Packed `seq_len` blocks drawn from several token streams by token-share weights."""

    def __init__(self, streams: dict[str, TokenStream], weights: dict[str, float], seq_len: int,
                 on_exhausted: str = "fail"):
        total = sum(weights.values())
        self.streams, self.seq_len, self.on_exhausted = streams, seq_len, on_exhausted
        self.weights = {k: v / total for k, v in weights.items()}
        self.taken = {k: 0 for k in streams}
        self.rebalanced: list[str] = []  # sources dropped past max_repeats, in order
        self.spans: list[tuple[str, int]] = []   # (source, record number) of each piece of the last block
        self.handed: list[tuple[str, int]] = []  # the same for this rank's blocks since take_records()

    def next_block(self) -> list[int] | None:
        """One full block, or None when non-repeating streams cannot fill another."""
        block: list[int] = []
        self.spans = []
        active = [k for k in self.streams if not self.streams[k].exhausted]
        while len(block) < self.seq_len and active:
            # deficit among the sources still drawing: once one is dropped (rebalance) the others
            # share its weight in proportion to their own
            seen = sum(self.taken[k] for k in active)
            total = sum(self.weights[k] for k in active)
            name = max(active, key=lambda k: self.weights[k] / total * seen - self.taken[k])
            stream = self.streams[name]
            piece = stream.take(self.seq_len - len(block))
            if not len(piece):
                if stream.repeat and self.on_exhausted == "fail":
                    raise ForgeError(
                        f"data source {name!r} ran out after {stream.repeats} repeat(s) (max_repeats "
                        f"{stream.max_repeats}); raise max_repeats, add data, or set on_exhausted: rebalance")
                if stream.repeat:  # rebalance: the others share its weight from here on
                    self.rebalanced.append(name)
                active.remove(name)
                continue
            block += piece.tolist() if isinstance(piece, np.ndarray) else piece
            self.taken[name] += len(piece)
            if (name, stream.record) not in self.spans[-1:]:
                self.spans.append((name, stream.record))
        return block if len(block) == self.seq_len else None

    def next_batch(self, batch_size: int, rank: int = 0, world: int = 1) -> torch.Tensor:
        """This rank's `batch_size` blocks out of the next `batch_size * world` (same stream on every rank)."""
        blocks = []
        for i in range(batch_size * world):
            block = self.next_block()
            if block is None:
                raise ForgeError("the data ran out before the stage's token budget was met")
            blocks.append(block)
            if i // batch_size == rank:
                self.handed += self.spans
        return torch.tensor(blocks[rank * batch_size:(rank + 1) * batch_size], dtype=torch.long)

    def take_records(self) -> list[tuple[str, int]]:
        """The (source, record number) of this rank's blocks handed out since the last call."""
        out, self.handed = self.handed, []
        return out

    def shares(self) -> dict[str, float]:
        seen = sum(self.taken.values()) or 1
        return {k: v / seen for k, v in self.taken.items()}

    def repeats(self) -> dict[str, int]:
        return {k: s.repeats for k, s in self.streams.items()}

    def state_dict(self) -> dict:
        return {"taken": dict(self.taken), "rebalanced": list(self.rebalanced),
                "streams": {k: s.state_dict() for k, s in self.streams.items()}}

    def load_state_dict(self, state: dict) -> None:
        self.taken, self.rebalanced = dict(state["taken"]), list(state["rebalanced"])
        for k, s in self.streams.items():
            s.load_state_dict(state["streams"][k])


def _mixture(sources: dict[str, Source], weights: dict[str, float], tokenizer, seq_len: int, separator: str,
             split: str, repeats: tuple[int | None, str] = (None, "fail")) -> MixedBlocks:
    train = split == "train"
    streams = {name: TokenStream(sources[name], tokenizer, separator, split, repeat=train, max_repeats=repeats[0])
               for name in weights}
    return MixedBlocks(streams, weights, seq_len, repeats[1])


def build_mixture(sources: dict[str, Source], weights: dict[str, float], tokenizer, seq_len: int,
                  separator: str, max_repeats: int | None = None, on_exhausted: str = "fail") -> MixedBlocks:
    """A training mixture: exhausted sources repeat (up to `max_repeats`, then `on_exhausted`)."""
    return _mixture(sources, weights, tokenizer, seq_len, separator, "train", (max_repeats, on_exhausted))


def eval_mixture(sources: dict[str, Source], weights: dict[str, float], tokenizer, seq_len: int,
                 separator: str) -> MixedBlocks:
    """An evaluation mixture of the held-out split: it stops when the data runs out."""
    return _mixture(sources, weights, tokenizer, seq_len, separator, "eval")


def eval_blocks(sources: dict[str, Source], weights: dict[str, float], tokenizer, seq_len: int,
                separator: str, max_blocks: int) -> torch.Tensor | None:
    """A fixed held-out set: up to `max_blocks` blocks from each source's held-out documents."""
    mix = eval_mixture(sources, weights, tokenizer, seq_len, separator)
    blocks = []
    while len(blocks) < max_blocks and (block := mix.next_block()) is not None:
        blocks.append(block)
    return torch.tensor(blocks, dtype=torch.long) if blocks else None
