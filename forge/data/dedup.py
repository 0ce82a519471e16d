"""Streaming duplicate and contamination indexes that hold only hashes, never text.

`ExactIndex` remembers a 64-bit digest per kept record; `MinHashLSH` keeps a MinHash
signature per kept record and finds near duplicates by banded LSH plus a signature
check (Broder 1997; Leskovec, Rajaraman & Ullman, *Mining of Massive Datasets* ch. 3);
`NgramIndex` holds the word n-grams of evaluation texts for decontamination (GPT-3,
Brown et al. 2020, appendix C: 13-grams). All hashes are keyed and process-independent
(blake2b + fixed-seed numpy), so a saved state reloads into identical behaviour.

Written here rather than taken from `datasketch` (about 150 lines): no new dependency,
stable hashes across processes for resume, a compact state of plain bytes, and n-gram
hashes vectorised over a record's word hashes instead of hashing each shingle string.
"""

from __future__ import annotations

import hashlib
import os
import string
import tempfile
from functools import cache

import numpy as np

from forge.data.keyindex import SpillIndex

# Punctuation (ASCII and the common Unicode marks) becomes space; 3x faster than re.findall(r"\w+").
_PUNCT = str.maketrans(dict.fromkeys(string.punctuation + "\u2018\u2019\u201c\u201d\u2013\u2014\u2026\u00ab\u00bb",
                                     " "))
_RNG_SEED = 0x5EED_F0E6


def words(text: str) -> list[str]:
    """Lower-cased word tokens with punctuation dropped (the GPT-3 decontamination normalisation)."""
    return text.lower().translate(_PUNCT).split()


class WordHasher:
    """64-bit blake2b hash per word, with a bounded cache (word frequencies are Zipfian)."""

    def __init__(self, max_cache: int = 1 << 16):  # ~10 MB at most; the common words stay hot
        self._cache: dict[str, int] = {}
        self._max = max_cache

    def __call__(self, toks: list[str]) -> np.ndarray:
        cache = self._cache
        out = list(map(cache.get, toks))
        if None in out:
            if len(cache) > self._max:
                cache.clear()
            for i, h in enumerate(out):
                if h is None:
                    w = toks[i]
                    h = int.from_bytes(hashlib.blake2b(w.encode(), digest_size=8).digest(), "little")
                    cache[w] = out[i] = h
        return np.array(out, dtype=np.uint64)


def _mix(z: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser (Steele et al. 2014), vectorised; a bijection on uint64."""
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


_POS = np.random.default_rng(_RNG_SEED).integers(0, 2**63, size=64, dtype=np.uint64) * np.uint64(2) + np.uint64(1)


def ngram_hashes(wh: np.ndarray, n: int) -> np.ndarray:
    """Hash of every run of `n` consecutive word hashes (order-sensitive); empty if fewer words."""
    if n > len(_POS):
        raise ValueError(f"n-gram size {n} > {len(_POS)}")
    m = len(wh) - n + 1
    if m <= 0:
        return np.empty(0, dtype=np.uint64)
    acc = wh[:m] * _POS[0]
    for j in range(1, n):
        acc = acc + wh[j:j + m] * _POS[j]
    return _mix(acc ^ np.uint64(n))


def shingles(wh: np.ndarray, k: int) -> np.ndarray:
    """k-word shingle hashes, repeats included (a MinHash is unchanged by them); a text
    shorter than k words is one shingle."""
    return ngram_hashes(wh, min(k, len(wh))) if len(wh) else np.empty(0, dtype=np.uint64)


class ExactIndex:
    """64-bit blake2b digests of whitespace-normalised texts already seen (a `SpillIndex`; a false
    match needs a 64-bit collision: about n^2 / 2^65, 3e-6 at ten million records)."""

    _SIZES = {"bloom_bits_log2": 25, "cache_mb": 4}  # one key a record, not 14: a smaller filter (4 MB)

    def __init__(self, spill_dir: str | os.PathLike | None = None) -> None:
        self.spill_dir = spill_dir
        self._index = SpillIndex(spill_dir=spill_dir, **self._SIZES)

    def __len__(self) -> int:
        return len(self._index)

    @staticmethod
    def key(text: str) -> int:
        return int.from_bytes(hashlib.blake2b(" ".join(text.split()).encode(), digest_size=8).digest(), "little")

    def seen_or_add(self, text: str) -> bool:
        k = self.key(text)
        if self._index.get(k) >= 0:
            return True
        self._index.insert((k,))
        return False

    def state(self) -> bytes:
        return self._index.items()[0].astype("<u8").tobytes()

    def load(self, blob: bytes) -> None:
        keys = np.frombuffer(blob, dtype="<u8").astype(np.uint64)
        self._index = SpillIndex.from_sorted(keys, spill_dir=self.spill_dir, **self._SIZES)


@cache
def lsh_params(threshold: float, num_perm: int, fp_weight: float = 0.1, fn_weight: float = 0.9
               ) -> tuple[int, int]:
    """(bands, rows) minimising the weighted false-positive plus false-negative area of the LSH
    S-curve P(candidate | Jaccard s) = 1 - (1 - s^r)^b around `threshold` (MMDS 3.4.2, as in
    datasketch). Weighted toward recall: every candidate is verified against its signature
    estimate, so a spurious candidate costs one comparison while a missed one keeps a duplicate."""
    lo, hi = np.linspace(0.0, threshold, 201), np.linspace(threshold, 1.0, 201)
    best, best_err = (1, num_perm), float("inf")
    for b in range(1, num_perm + 1):
        for r in range(1, num_perm // b + 1):
            fp = np.trapezoid(1 - (1 - lo**r) ** b, lo)
            fn = np.trapezoid((1 - hi**r) ** b, hi)
            err = fp_weight * fp + fn_weight * fn
            if err < best_err:
                best, best_err = (b, r), err
    return best


class MinHashLSH:
    """MinHash signatures (multiply-add-shift hash family) with banded LSH for near duplicates.

    A record is a near duplicate when some band of its signature equals a band of a kept
    record and the signatures agree on at least `threshold` of their positions (the
    MinHash estimate of Jaccard similarity). The band keys (14 per kept record at the defaults:
    14 bands of 9 rows) live in a `SpillIndex`, so their memory is bounded too. Signatures
    (`4 * num_perm` bytes each) are needed only to verify a band hit, so with `spill` (the default)
    every full chunk of them moves to an unlinked temporary file (under `spill_dir`) and a hit reads
    its 512 bytes back; RAM holds one chunk (2 MB) of them.
    """

    _CHUNK = 4096

    def __init__(self, threshold: float = 0.8, num_perm: int = 128, spill: bool = True,
                 spill_dir: str | os.PathLike | None = None):
        self.threshold, self.num_perm, self.spill, self.spill_dir = threshold, num_perm, spill, spill_dir
        self._file = None  # the spill file: chunk c at byte c * _CHUNK * num_perm * 4
        self.bands, self.rows = lsh_params(threshold, num_perm)
        rng = np.random.default_rng(_RNG_SEED + num_perm)
        self._a = rng.integers(0, 2**63, size=num_perm, dtype=np.uint64) * np.uint64(2) + np.uint64(1)
        self._b = rng.integers(0, 2**63, size=num_perm, dtype=np.uint64)
        self._band_mul = rng.integers(0, 2**63, size=(self.bands, self.rows), dtype=np.uint64) | np.uint64(1)
        self._buckets = SpillIndex(spill_dir=spill_dir)  # band key -> row of the first kept record with it
        self._chunks: list[np.ndarray | None] = []  # None: that chunk is in the spill file
        self._n = 0

    def __len__(self) -> int:
        return self._n

    def signature(self, shingle_hashes: np.ndarray) -> np.ndarray:
        """Per permutation, the minimum over shingles of the top 32 bits of `a * x + b mod 2^64`
        (multiply-add-shift hashing, Dietzfelbinger 1996); the shift commutes with the min."""
        best = None
        for i in range(0, len(shingle_hashes), 1024):  # bound the (shingles x perms) temporary
            h = shingle_hashes[i:i + 1024, None] * self._a
            h += self._b
            m = h.min(axis=0)
            best = m if best is None else np.minimum(best, m)
        return (best >> np.uint64(32)).astype(np.uint32)

    def band_keys(self, sigs: np.ndarray) -> np.ndarray:
        """The band keys of a signature, or of a stack of them (one row each): what the buckets hold."""
        return self._band_keys(sigs)

    def similar(self, a: np.ndarray, b: np.ndarray) -> bool:
        """Whether two signatures agree on at least `threshold` of their positions (a near duplicate)."""
        return np.count_nonzero(a == b) >= self.threshold * self.num_perm

    def _band_keys(self, sigs: np.ndarray) -> np.ndarray:
        """One 64-bit key per band (the band index mixed in) for a signature or a stack of them."""
        used = sigs[..., : self.bands * self.rows].astype(np.uint64)
        used = used.reshape(*sigs.shape[:-1], self.bands, self.rows)
        return _mix((used * self._band_mul).sum(axis=-1, dtype=np.uint64) + np.arange(self.bands, dtype=np.uint64))

    def _row(self, i: int) -> np.ndarray:
        chunk = self._chunks[i // self._CHUNK]
        if chunk is not None:
            return chunk[i % self._CHUNK]
        size = self.num_perm * 4
        return np.frombuffer(os.pread(self._file.fileno(), size, i * size), dtype=np.uint32)

    def _spill_full(self) -> None:
        """Move every full chunk but the newest to the spill file."""
        if not self.spill:
            return
        for c, chunk in enumerate(self._chunks):
            if chunk is not None and (c + 1) * self._CHUNK <= self._n and c < len(self._chunks) - 1:
                if self._file is None:
                    self._file = tempfile.TemporaryFile(prefix="forge-minhash-", dir=self.spill_dir)
                os.pwrite(self._file.fileno(), chunk.tobytes(), c * self._CHUNK * self.num_perm * 4)
                self._chunks[c] = None

    def seen_or_add(self, sig: np.ndarray) -> bool:
        """True if `sig` is a near duplicate of a kept record; otherwise keep it and return False."""
        keys = self._band_keys(sig)
        rows = self._buckets.lookup(keys)
        for row in dict.fromkeys(rows[rows >= 0].tolist()):
            if self.similar(self._row(row), sig):
                return True
        self._add(sig, keys[rows < 0])
        return False

    def _add(self, sig: np.ndarray, new_keys: np.ndarray) -> None:
        if self._n % self._CHUNK == 0:
            self._chunks.append(np.empty((self._CHUNK, self.num_perm), dtype=np.uint32))
            self._spill_full()
        self._chunks[-1][self._n % self._CHUNK] = sig
        self._buckets.insert(new_keys, self._n)
        self._n += 1

    def state(self) -> bytes:
        if not self._n:
            return b""
        rows = [self._chunk(c) for c in range(len(self._chunks))]
        return np.concatenate(rows)[: self._n].astype("<u4").tobytes()

    def _chunk(self, c: int) -> np.ndarray:
        if self._chunks[c] is not None:
            return self._chunks[c]
        size = self._CHUNK * self.num_perm * 4
        return np.frombuffer(os.pread(self._file.fileno(), size, c * size), dtype=np.uint32).reshape(self._CHUNK, -1)

    def load(self, blob: bytes) -> None:
        """Rebuild from `state()`: each band key maps to the first row that has it, as when added."""
        sigs = np.frombuffer(blob, dtype="<u4").reshape(-1, self.num_perm).astype(np.uint32)
        self._n = len(sigs)
        self._chunks = [np.empty((self._CHUNK, self.num_perm), dtype=np.uint32)
                        for _ in range(-(-self._n // self._CHUNK))]
        for i in range(0, self._n, self._CHUNK):
            self._chunks[i // self._CHUNK][: len(sigs[i:i + self._CHUNK])] = sigs[i:i + self._CHUNK]
        keys, first = np.unique(self._band_keys(sigs).ravel(), return_index=True)  # row-major: earliest row
        self._buckets = SpillIndex.from_sorted(keys, (first // self.bands).astype(np.int32), spill_dir=self.spill_dir)
        self._spill_full()


class NgramIndex:
    """Word n-grams of evaluation texts; a training text that shares any one is contaminated.

    Evaluation texts shorter than `n` words but at least `min_n` long are indexed whole
    (their full word sequence must then appear in a training text); shorter ones are ignored.
    """

    def __init__(self, texts, n: int = 13, min_n: int = 8, hasher: WordHasher | None = None):
        self.n, self.min_n = n, min_n
        self._hash = hasher or WordHasher()
        full: list[np.ndarray] = []
        short: dict[int, set[int]] = {}
        self.texts = 0
        for text in texts:
            wh = self._hash(words(text))
            self.texts += 1
            if len(wh) >= n:
                full.append(ngram_hashes(wh, n))
            elif len(wh) >= min_n:
                short.setdefault(len(wh), set()).update(ngram_hashes(wh, len(wh)).tolist())
        self._full = np.unique(np.concatenate(full)) if full else np.empty(0, dtype=np.uint64)
        self._short = {m: np.array(sorted(s), dtype=np.uint64) for m, s in short.items()}

    def __len__(self) -> int:
        return len(self._full) + sum(len(v) for v in self._short.values())

    @staticmethod
    def _any_in(needles: np.ndarray, sorted_hay: np.ndarray) -> bool:
        if not len(needles) or not len(sorted_hay):
            return False
        pos = np.searchsorted(sorted_hay, needles).clip(max=len(sorted_hay) - 1)
        return bool((sorted_hay[pos] == needles).any())

    def save(self, path: str) -> None:
        """The index as plain arrays (numpy's .npz, no pickle), for worker processes to load."""
        arrays = {f"short_{m}": v for m, v in self._short.items()}
        np.savez(path, full=self._full, sizes=np.array([self.n, self.min_n, self.texts]), **arrays)

    @classmethod
    def load(cls, path: str) -> NgramIndex:
        """An index `save` wrote (loaded without pickle: data files never run code)."""
        index = cls([])
        with np.load(path, allow_pickle=False) as z:
            index.n, index.min_n, index.texts = (int(v) for v in z["sizes"])
            index._full = z["full"]
            index._short = {int(k.removeprefix("short_")): z[k] for k in z.files if k.startswith("short_")}
        return index

    def contaminated(self, wh: np.ndarray) -> bool:
        """Whether the word hashes `wh` of a training text share an indexed n-gram."""
        if self._any_in(ngram_hashes(wh, self.n), self._full):
            return True
        return any(self._any_in(ngram_hashes(wh, m), hay) for m, hay in self._short.items() if m <= len(wh))
