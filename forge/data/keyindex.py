"""Insert-only maps from 64-bit hashes to row numbers, for the dedup indexes in `forge.data.dedup`.

`CompactIndex` keeps keys in sorted numpy arrays (about 12 bytes a key); `SpillIndex` keeps up to
`RAM_KEYS` of them that way and moves the rest to SQLite on disk behind a fixed `BloomFilter`, so
its memory does not grow with the corpus.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import tempfile
import weakref

import numpy as np

RAM_KEYS = 1 << 18  # keys a SpillIndex holds in memory before it spills to disk (~3 MB)


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
    def from_sorted(cls, keys: np.ndarray, vals: np.ndarray | None = None) -> CompactIndex:
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
                    spill_dir=None, **sizes) -> SpillIndex:
        index = cls(ram_keys, spill_dir, **sizes)
        index._ram = CompactIndex.from_sorted(keys, vals)
        if len(keys) > index.ram_keys:
            index._spill()
        return index


def _drop_spill(db: sqlite3.Connection, folder: str) -> None:
    db.close()
    shutil.rmtree(folder, ignore_errors=True)
