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
import shutil
import sqlite3
import string
import tempfile
import weakref
from functools import lru_cache

import numpy as np

# Punctuation (ASCII and the common Unicode marks) becomes space; 3x faster than re.findall(r"\w+").
_PUNCT = str.maketrans(dict.fromkeys(string.punctuation + "\u2018\u2019\u201c\u201d\u2013\u2014\u2026\u00ab\u00bb",
                                     " "))
_RNG_SEED = 0x5EED_F0E6
RAM_KEYS = 1 << 18  # keys a SpillIndex holds in memory before it spills to disk (~3 MB)


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


class CompactIndex:
    """Insert-only map from uint64 keys to int32 values at ~12 bytes a key.

    New keys go to a dict buffer; when the buffer passes a quarter of the sorted part (at
    least 64k keys) it is merged into sorted numpy arrays, so lookups are one `searchsorted`
    plus a dict probe and a Python object per key never outlives a merge.
    """

    def __init__(self) -> None:
        self._keys = np.empty(0, dtype=np.uint64)
        self._vals = np.empty(0, dtype=np.int32)
        self._buf: dict[int, int] = {}

    def __len__(self) -> int:
        return len(self._keys) + len(self._buf)

    def lookup(self, keys: np.ndarray) -> np.ndarray:
        """The value of each key, or -1 where absent."""
        out = np.full(len(keys), -1, dtype=np.int64)
        if len(self._keys):
            pos = np.searchsorted(self._keys, keys).clip(max=len(self._keys) - 1)
            hit = self._keys[pos] == keys
            out[hit] = self._vals[pos[hit]]
        if self._buf:
            get = self._buf.get
            for i, k in enumerate(keys.tolist()):
                if out[i] < 0:
                    out[i] = get(k, -1)
        return out

    def get(self, key: int) -> int:
        """The value of one key, or -1 (a scalar fast path of `lookup`)."""
        v = self._buf.get(key)
        if v is not None:
            return v
        i = int(self._keys.searchsorted(np.uint64(key))) if len(self._keys) else 0
        return int(self._vals[i]) if i < len(self._keys) and int(self._keys[i]) == key else -1

    def insert(self, keys, value: int = 0) -> None:
        """Add keys (ints or a uint64 array) that `lookup` said were absent."""
        for k in keys.tolist() if isinstance(keys, np.ndarray) else keys:
            self._buf.setdefault(k, value)
        if len(self._buf) >= max(1 << 16, len(self._keys) // 4):
            self.flush()

    def flush(self) -> None:
        if not self._buf:
            return
        keys = np.concatenate([self._keys, np.fromiter(self._buf.keys(), np.uint64, len(self._buf))])
        vals = np.concatenate([self._vals, np.fromiter(self._buf.values(), np.int32, len(self._buf))])
        order = np.argsort(keys, kind="stable")
        self._keys, self._vals, self._buf = keys[order], vals[order], {}

    @classmethod
    def from_sorted(cls, keys: np.ndarray, vals: np.ndarray | None = None) -> "CompactIndex":
        index = cls()
        index._keys = keys
        index._vals = np.zeros(len(keys), dtype=np.int32) if vals is None else vals
        return index

    def sorted_keys(self) -> np.ndarray:
        self.flush()
        return self._keys


class BloomFilter:
    """Fixed-size Bloom filter over already-mixed uint64 keys: `k` probes `h1 + i*h2` (Kirsch &
    Mitzenmacher 2006). It answers "surely absent" for most keys that were never added, which spares
    a disk lookup; false positives cost only that lookup, never a wrong answer."""

    def __init__(self, bits_log2: int = 28, probes: int = 4):
        self._mask = np.uint64((1 << bits_log2) - 1)
        self._probes = np.arange(probes, dtype=np.uint64)[:, None]
        self._bytes = np.zeros(1 << (bits_log2 - 3), dtype=np.uint8)

    def _positions(self, keys: np.ndarray) -> np.ndarray:
        h2 = (keys >> np.uint64(32)) | np.uint64(1)
        return ((keys + self._probes * h2) & self._mask).ravel()

    def add(self, keys: np.ndarray) -> None:
        pos = self._positions(keys)
        np.bitwise_or.at(self._bytes, pos >> np.uint64(3), np.left_shift(1, pos & np.uint64(7)).astype(np.uint8))

    def maybe(self, keys: np.ndarray) -> np.ndarray:
        """False where a key was surely never added."""
        pos = self._positions(keys)
        hit = (self._bytes[pos >> np.uint64(3)] >> (pos & np.uint64(7)).astype(np.uint8)) & 1
        return hit.reshape(len(self._probes), len(keys)).all(axis=0)


class SpillIndex:
    """Insert-only map from uint64 keys to int32 values whose memory does not grow with the data.

    Up to `ram_keys` keys live in a `CompactIndex`; past that they move, sorted, into a SQLite
    table in a private temporary folder (under `spill_dir`), fronted by a fixed-size `BloomFilter`
    so that looking up a new key (the common case: most records are not duplicates) rarely touches
    the disk. RAM: about 12 bytes a key up to `ram_keys` (3 MB at the default), plus the filter
    (32 MB by default) and SQLite's page cache (16 MB by default) once spilled. SQLite rather than a hand-made on-disk
    table: it is in the standard library, crash-safe and fast at sorted bulk inserts.
    """

    def __init__(self, ram_keys: int | None = None, spill_dir: str | os.PathLike | None = None,
                 bloom_bits_log2: int = 28, cache_mb: int = 16):
        self.ram_keys, self.spill_dir = ram_keys or RAM_KEYS, spill_dir
        self._bloom_bits_log2, self._cache_mb = bloom_bits_log2, cache_mb
        self._ram = CompactIndex()
        self._db: sqlite3.Connection | None = None
        self._bloom: BloomFilter | None = None
        self._on_disk = 0

    def __len__(self) -> int:
        return len(self._ram) + self._on_disk

    @property
    def spilled(self) -> bool:
        return self._db is not None

    def lookup(self, keys: np.ndarray) -> np.ndarray:
        """The value of each key, or -1 where absent."""
        out = self._ram.lookup(keys)
        if self._db is not None:
            ask = (out < 0) & self._bloom.maybe(keys)
            if ask.any():
                found = self._disk_get(keys[ask])
                out[ask] = [found.get(k, -1) for k in keys[ask].view(np.int64).tolist()]
        return out

    def get(self, key: int) -> int:
        """The value of one key, or -1 (a scalar fast path of `lookup`)."""
        v = self._ram.get(key)
        if v >= 0 or self._db is None:
            return v
        return int(self.lookup(np.array([key], dtype=np.uint64))[0])

    def insert(self, keys, value: int = 0) -> None:
        """Add keys (ints or a uint64 array) that `lookup` said were absent."""
        self._ram.insert(keys, value)
        if len(self._ram) > self.ram_keys:
            self._spill()

    def _spill(self) -> None:
        keys = self._ram.sorted_keys()
        vals = self._ram._vals
        if self._db is None:
            self._open()
        self._db.execute("BEGIN")  # one transaction: autocommit would commit every row
        try:
            for i in range(0, len(keys), 1 << 16):  # in slices: Python ints for all keys would cost 70 B each
                part = keys[i:i + (1 << 16)]
                self._bloom.add(part)
                self._db.executemany("INSERT OR IGNORE INTO k VALUES (?, ?)",
                                     zip(part.view(np.int64).tolist(), vals[i:i + (1 << 16)].tolist()))
        finally:
            self._db.execute("COMMIT")
        self._on_disk += len(keys)
        self._ram = CompactIndex()

    def _open(self) -> None:
        folder = tempfile.mkdtemp(prefix="forge-dedup-", dir=self.spill_dir)
        db = sqlite3.connect(os.path.join(folder, "index.db"), isolation_level=None, check_same_thread=False)
        # A scratch index: nothing to recover after a crash, so no journal and no fsync.
        for pragma in ("journal_mode=OFF", "synchronous=OFF", f"cache_size=-{self._cache_mb * 1000}", "temp_store=FILE"):
            db.execute(f"PRAGMA {pragma}")
        db.execute("CREATE TABLE k (key INTEGER PRIMARY KEY, val INTEGER) WITHOUT ROWID")
        self._db, self._bloom = db, BloomFilter(self._bloom_bits_log2)
        weakref.finalize(self, _drop_spill, db, folder)

    def _disk_get(self, keys: np.ndarray) -> dict[int, int]:
        found: dict[int, int] = {}
        signed = keys.view(np.int64).tolist()
        for i in range(0, len(signed), 500):  # SQLite's bound-parameter limit is 999 on old builds
            part = signed[i:i + 500]
            q = f"SELECT key, val FROM k WHERE key IN ({','.join('?' * len(part))})"
            found.update(self._db.execute(q, part).fetchall())
        return found

    def items(self) -> tuple[np.ndarray, np.ndarray]:
        """All (keys, values), sorted by key (for `state()`; reads the spilled part back)."""
        keys, vals = self._ram.sorted_keys(), self._ram._vals
        if self._db is None:
            return keys, vals
        rows = np.array(self._db.execute("SELECT key, val FROM k").fetchall(), dtype=np.int64).reshape(-1, 2)
        keys = np.concatenate([rows[:, 0].view(np.uint64), keys])
        vals = np.concatenate([rows[:, 1].astype(np.int32), vals])
        order = np.argsort(keys, kind="stable")
        return keys[order], vals[order]

    @classmethod
    def from_sorted(cls, keys: np.ndarray, vals: np.ndarray | None = None, ram_keys: int | None = None,
                    spill_dir=None, **sizes) -> "SpillIndex":
        index = cls(ram_keys, spill_dir, **sizes)
        index._ram = CompactIndex.from_sorted(keys, vals)
        if len(keys) > index.ram_keys:
            index._spill()
        return index


def _drop_spill(db: sqlite3.Connection, folder: str) -> None:
    db.close()
    shutil.rmtree(folder, ignore_errors=True)


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


@lru_cache(maxsize=None)
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
    14 bands of 9 rows) live in a `SpillIndex`, so their memory is bounded too. Signatures (`4 * num_perm` bytes each) are needed only to
    verify a band hit, so with `spill` (the default) every full chunk of them moves to an unlinked
    temporary file (under `spill_dir`) and a hit reads its 512 bytes back; RAM holds one chunk
    (2 MB) of them.
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
            if np.count_nonzero(self._row(row) == sig) >= self.threshold * self.num_perm:
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

    def contaminated(self, wh: np.ndarray) -> bool:
        """Whether the word hashes `wh` of a training text share an indexed n-gram."""
        if self._any_in(ngram_hashes(wh, self.n), self._full):
            return True
        return any(self._any_in(ngram_hashes(wh, m), hay) for m, hay in self._short.items() if m <= len(wh))
