"""Weighted mixing of sources by share of trained tokens, packed into fixed-length blocks.

Documents are tokenized in batches, joined with a separator (EOS after, or BOS before, each
document) and cut into `seq_len` blocks with no padding. Each piece of a block comes from the
source whose share of tokens so far lags its weight the most (a deficit rule, deterministic), so
every source's share of trained tokens matches its weight to within one piece over a run. A source
that runs out starts again from its first document and its repeat count goes up. The blocks are
laid out from the documents' lengths and cut from their ids afterwards (forge.data.blocks):
`build_mixture` plans them as they are drawn; `launch_mixture` reads the blocks a training launch
planned once, each rank cutting only its own. The loader's position is the number of blocks drawn,
saved with checkpoints, so a resumed run sees the same tokens an uninterrupted one would.
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from forge.data.blocks import (
    ENCODE_BATCH,
    WINDOW_TOKENS,
    CachedDocs,
    EncodedDocs,
    Layout,
    Planner,
    Ranks,
    Stream,
    cut,
    prepare,
    spans,
    write_layout,
)
from forge.data.sources import Source
from forge.data.tokencache import WINDOW_CHARS, Encoder, token_cache, tokenizer_digest, worth_caching
from forge.errors import ForgeError

WINDOW_CHARS = WINDOW_CHARS  # a longer text is encoded a window at a time: memory follows the window
LAYOUT_VERSION = 1  # part of a prepared layout's key: a forge that lays blocks out otherwise plans anew


def in_holdout(source: str, record: int, fraction: float) -> bool:
    """Stable split: a record is held out when its hash falls below `fraction` (no RNG state).
    It depends on the data alone, never on a stage's seed, so every stage holds out the same
    documents and no stage evaluates on what an earlier one trained on."""
    digest = hashlib.blake2b(f"holdout:{source}:{record}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64 < fraction


def aligned(flagged: list[tuple[dict, bool]], source: str, holdout: float) -> list[dict]:
    """(record, held out) pairs ordered so that record number n (from 1) is a held-out one exactly when
    in_holdout(source, n, holdout): the training records fill the other numbers in their order, the
    held-out ones the held-out numbers (starting over if they run out: the split's share is the
    hash's, the units' share only near it); it ends with the last training record."""
    train = [r for r, held in flagged if not held]
    held = [r for r, h in flagged if h]
    out: list[dict] = []
    i = j = 0
    n = 0
    while i < len(train):
        n += 1
        if in_holdout(source, n, holdout) and held:
            out.append(held[j % len(held)])
            j += 1
        elif in_holdout(source, n, holdout):
            break  # nothing held out to put here (a tiny set): end before a training record could
        else:
            out.append(train[i])
            i += 1
    return out


class Split:
    """The documents of a source a stream reads: its held-out ones (eval) or the others (train)."""

    def __init__(self, name: str, source: Source):
        self.name, self.key, self.fraction = name, source.holdout_key, source.holdout  # a curated set: its own split

    def keep(self, record: int) -> bool:
        held = in_holdout(self.key, record, self.fraction)
        return held if self.name == "eval" else not held

    def mask(self, records: np.ndarray) -> np.ndarray:
        if self.fraction <= 0:  # nothing is held out (in_holdout is False for every record)
            held = np.zeros(len(records), bool)
        else:
            held = np.fromiter((in_holdout(self.key, r, self.fraction) for r in records.tolist()), bool, len(records))
        return held if self.name == "eval" else ~held


@dataclass(frozen=True)
class Mix:
    """A mixture: token-share weights per source, the block length and separator, and what a source
    that runs out does (repeat up to `max_repeats`, then `on_exhausted`: fail or rebalance)."""

    weights: dict[str, float]
    seq_len: int
    separator: str
    max_repeats: int | None = None
    on_exhausted: str = "fail"


class MixedBlocks:
    """Packed `seq_len` blocks drawn from several sources by token-share weights: planned as they are
    drawn (a Planner), or read from a launch's prepared Layout. `taken` and `repeats()` count every
    rank's blocks; `handed` names the records of this rank's."""

    def __init__(self, plan: Planner | Layout, docs: list, seq_len: int, sep: tuple[int, bool]):
        self.plan, self.docs, self.seq_len, self.sep = plan, docs, seq_len, sep
        self.names = plan.names if isinstance(plan, Layout) else [s.name for s in plan.streams]
        self.position = 0  # blocks drawn so far, every rank's
        self.read = 0      # blocks this process cut (its own share of a launch)
        self.spans: list[tuple[str, int]] = []   # (source, record number) of each piece of the last block cut
        self.handed: list[tuple[str, int]] = []  # the same for this rank's blocks since take_records()

    @property
    def streams(self) -> dict[str, Stream]:
        """The sources' streams of a mixture planned as it is drawn."""
        return {s.name: s for s in self.plan.streams} if isinstance(self.plan, Planner) else {}

    @property
    def taken(self) -> dict[str, int]:
        """Tokens taken from each source by the blocks drawn so far."""
        if isinstance(self.plan, Layout):
            return self.plan.taken(self.position)
        return dict(zip(self.names, self.plan.taken))

    @property
    def rebalanced(self) -> list[str]:
        """Sources dropped past max_repeats, in order."""
        if isinstance(self.plan, Layout):
            return self.plan.rebalanced(self.position)
        return [name for _, name in self.plan.rebalanced]

    def _cut(self, pieces: list) -> np.ndarray:
        self.spans = spans(pieces, self.names)
        self.read += 1
        return cut(pieces, self.docs, self.seq_len, self.sep)

    def _planned(self) -> list | None:
        """The next block's pieces (None when the data cannot fill it); the position moves on."""
        if isinstance(self.plan, Layout):
            if self.position >= self.plan.blocks:
                raise ForgeError(f"the stage drew more than the {self.plan.blocks} blocks its launch prepared")
            pieces = self.plan.block(self.position)
        else:
            pieces = self.plan.block()
        self.position += 1
        return pieces

    def _release(self) -> None:
        if isinstance(self.plan, Planner):
            for stream in self.plan.streams:
                stream.release()

    def next_block(self) -> list[int] | None:
        """One full block, or None when non-repeating streams cannot fill another."""
        pieces = self._planned()
        if pieces is None:
            return None
        block = self._cut(pieces).tolist()
        self._release()
        return block

    def next_batch(self, batch_size: int, rank: int = 0, world: int = 1) -> torch.Tensor:
        """This rank's `batch_size` blocks out of the next `batch_size * world`: only they are cut (a
        prepared layout reads only their pieces)."""
        mine = range(rank * batch_size, (rank + 1) * batch_size)
        blocks = []
        if isinstance(self.plan, Layout):
            if self.position + batch_size * world > self.plan.blocks:
                raise ForgeError(f"the stage drew more than the {self.plan.blocks} blocks its launch prepared")
            for i in mine:
                blocks.append(self._cut(self.plan.block(self.position + i)))
                self.handed += self.spans
            self.position += batch_size * world
        else:
            for i in range(batch_size * world):
                pieces = self._planned()
                if pieces is None:
                    raise ForgeError("the data ran out before the stage's token budget was met")
                if i in mine:
                    blocks.append(self._cut(pieces))
                    self.handed += self.spans
                self._release()
        return torch.from_numpy(np.stack(blocks))

    def take_records(self) -> list[tuple[str, int]]:
        """The (source, record number) of this rank's blocks handed out since the last call."""
        out, self.handed = self.handed, []
        return out

    def shares(self) -> dict[str, float]:
        taken = self.taken
        seen = sum(taken.values()) or 1
        return {k: v / seen for k, v in taken.items()}

    def repeats(self) -> dict[str, int]:
        if isinstance(self.plan, Layout):
            return self.plan.repeats(self.position)
        return {s.name: s.repeats for s in self.plan.streams}

    def state_dict(self) -> dict:
        """The position (blocks drawn, every rank's), and for readers each source's tokens and repeats."""
        taken, repeats = self.taken, self.repeats()
        return {"block": self.position, "streams": {k: {"taken": taken[k], "repeats": repeats[k]} for k in taken}}

    def load_state_dict(self, state: dict) -> None:
        """Continue after the saved number of blocks (a mixture planned as drawn plans them again)."""
        if "block" not in state:
            raise ForgeError("the checkpoint's data position was written by an earlier forge (a position in each "
                             "source); this forge resumes from a block count: start the stage over (forge run --restart)")
        target = int(state["block"])
        if isinstance(self.plan, Layout):
            if target > self.plan.blocks:
                raise ForgeError(f"the checkpoint is {target} blocks in, past the {self.plan.blocks} this launch prepared")
            self.position = target
            return
        if target < self.position:
            raise ValueError("load_state_dict needs a mixture that has not drawn past the saved position")
        while self.position < target:
            if self._planned() is None:
                raise ForgeError(f"the data changed since the checkpoint: it ends before block {target}")
            self._release()


def _sep(tokenizer, separator: str) -> tuple[int, bool]:
    sep_id = tokenizer.eos_token_id if separator == "eos" else tokenizer.bos_token_id
    if sep_id is None:
        raise ForgeError(f"the tokenizer has no {separator.upper()} token; set the stage's separator to the other one")
    return sep_id, separator == "eos"


def _docs(source: Source, tokenizer, sink=None) -> CachedDocs | EncodedDocs:
    """A source with a `token_dir` is encoded once, by its `workers` (forge.data.tokencache), and read
    from there; another is encoded as it is read."""
    if worth_caching(source):
        return CachedDocs(token_cache(source, tokenizer, Path(source.token_dir), source.workers).folder)
    return EncodedDocs(source, Encoder(tokenizer, WINDOW_CHARS), sink)


def _planner(docs: dict[str, CachedDocs | EncodedDocs], sources: dict[str, Source], mix: Mix, sep: tuple[int, bool],
             split: str) -> Planner:
    train = split == "train"
    streams = [Stream(docs[name], name, Split(split, sources[name]), train, sep[1], mix.max_repeats if train else None)
               for name in mix.weights]
    return Planner(streams, mix.weights, mix.seq_len, mix.on_exhausted if train else "fail")


def _mixture(sources: dict[str, Source], mix: Mix, tokenizer, split: str) -> MixedBlocks:
    sep = _sep(tokenizer, mix.separator)
    docs = {name: _docs(sources[name], tokenizer) for name in mix.weights}
    return MixedBlocks(_planner(docs, sources, mix, sep, split), list(docs.values()), mix.seq_len, sep)


def build_mixture(sources: dict[str, Source], weights: dict[str, float], tokenizer, seq_len: int,
                  separator: str, max_repeats: int | None = None, on_exhausted: str = "fail") -> MixedBlocks:
    """A training mixture planned as it is drawn: exhausted sources repeat (up to `max_repeats`, then
    `on_exhausted`)."""
    return _mixture(sources, Mix(weights, seq_len, separator, max_repeats, on_exhausted), tokenizer, "train")


def eval_mixture(sources: dict[str, Source], weights: dict[str, float], tokenizer, seq_len: int,
                 separator: str) -> MixedBlocks:
    """An evaluation mixture of the held-out split: it stops when the data runs out."""
    return _mixture(sources, Mix(weights, seq_len, separator), tokenizer, "eval")


def eval_blocks(sources: dict[str, Source], weights: dict[str, float], tokenizer, seq_len: int,
                separator: str, max_blocks: int) -> torch.Tensor | None:
    """A fixed held-out set: up to `max_blocks` blocks from each source's held-out documents."""
    mix = eval_mixture(sources, weights, tokenizer, seq_len, separator)
    blocks = []
    while len(blocks) < max_blocks and (block := mix.next_block()) is not None:
        blocks.append(block)
    return torch.tensor(blocks, dtype=torch.long) if blocks else None


def _identity(source: Source) -> list:
    """What a source's documents depend on: its files (path, size, modification time), how they are
    read, and whether they come from a token cache."""
    files = [(str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in source.files]
    fields = {f.name: repr(getattr(source, f.name)) for f in dataclasses.fields(source)
              if f.compare and f.name != "files"}
    return [files, fields, repr(source.chat), worth_caching(source)]


def layout_key(sources: dict[str, Source], mix: Mix, tokenizer, blocks: int) -> str:
    """The prepared layout's name: everything its blocks depend on."""
    what = [LAYOUT_VERSION, tokenizer_digest(tokenizer), [[n, w, _identity(sources[n])] for n, w in mix.weights.items()],
            mix.seq_len, mix.separator, mix.max_repeats, mix.on_exhausted, blocks,
            [WINDOW_CHARS, WINDOW_TOKENS, ENCODE_BATCH]]
    return hashlib.sha256(json.dumps(what, default=str).encode()).hexdigest()[:16]


def launch_mixture(sources: dict[str, Source], mix: Mix, tokenizer, blocks: int, ranks: Ranks) -> MixedBlocks:
    """A training launch's mixture: its first `blocks` blocks (every rank's) planned once, by rank 0,
    into `ranks.folder` (the other ranks wait); each rank then cuts only its own from the token caches
    (and the ids rank 0 stored for sources without one). The same blocks, records and counts as
    `build_mixture` with the same settings."""
    sep = _sep(tokenizer, mix.separator)
    key = layout_key(sources, mix, tokenizer, blocks)

    def plan(folder: Path) -> None:
        with contextlib.ExitStack() as files:
            docs, meta = {}, []
            for i, name in enumerate(mix.weights):
                if worth_caching(sources[name]):
                    docs[name] = _docs(sources[name], tokenizer)
                    meta.append({"cache": str(docs[name].cache.folder)})
                else:  # encoded here, once: the ids go beside the layout for every rank to cut from
                    sink = files.enter_context(open(folder / f"store-{i}.bin", "wb"))
                    docs[name] = _docs(sources[name], tokenizer, sink)
                    meta.append({"store": f"store-{i}.bin"})
            planner = _planner(docs, sources, mix, sep, "train")
            write_layout(folder, planner, blocks, {"names": list(mix.weights), "docs": meta, "seq_len": mix.seq_len})

    layout = Layout(prepare(ranks, key, plan))
    return MixedBlocks(layout, layout.docs, mix.seq_len, sep)
