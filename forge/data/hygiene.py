"""Data hygiene for training records: PII/secret redaction, deduplication, decontamination.

One `Hygiene` object is shared by all sources of a run, so duplicates are caught within
and across sources. `process` streams: it holds hashes and MinHash signatures of the
records it kept (and the n-gram hashes of the evaluation texts), never the records.
Matched PII values are never stored, logged or put in an error message; only counts are.

Per record, in order:
  1. PII scan (`forge.data.pii`) on the original text: `fail` raises, `drop` drops it.
  2. Decontamination on the original text: any shared word n-gram with an eval text drops it.
  3. Redaction of the findings (mode `redact`).
  4. Deduplication of the text as it would be emitted: exact (whitespace-normalised
     digest), then near (MinHash/LSH over word shingles). The first occurrence is kept.
"""

from __future__ import annotations

import os
import re
from dataclasses import asdict, dataclass, field, fields
from typing import Iterable, Iterator, Literal

from pydantic import ConfigDict

from forge.data import pii as _pii
from forge.data.dedup import ExactIndex, MinHashLSH, NgramIndex, WordHasher, shingles, words
from forge.data.pii import PII_TYPES, Finding, redact, scan_pii
from forge.errors import ForgeError

__all__ = ["ConfigError", "HygieneConfig", "HygieneStats", "Hygiene", "Finding", "PII_TYPES", "scan_pii", "redact"]

_STATE_VERSION = 1


class ConfigError(ForgeError, ValueError):
    """A bad setting: a ForgeError for callers, a ValueError for pydantic (the recipe's validator)."""


@dataclass(frozen=True)
class HygieneConfig:
    """Hygiene settings: the recipe's `hygiene:` section (pydantic validates this dataclass there)
    and what `Hygiene` runs with."""

    __pydantic_config__ = ConfigDict(extra="forbid")
    pii: Literal["redact", "drop", "fail", "off"] = "redact"
    pii_types: tuple[str, ...] | None = None  # None = all of PII_TYPES
    dedup: Literal["exact", "near", "off"] = "near"  # "near" also removes exact duplicates
    near_threshold: float = 0.8  # estimated Jaccard similarity of word-shingle sets
    decontaminate_against: tuple[str, ...] = ()  # data sources that are evaluation sets
    ngram: int = 13  # n-gram length for decontamination; 0 turns it off
    shingle_size: int = 5  # words per shingle for near-dedup
    num_perm: int = 128  # MinHash signature length
    decontam_min_ngram: int = 8  # eval texts shorter than ngram but this long are matched whole

    def __post_init__(self) -> None:
        def bad(name: str, why: str) -> ConfigError:
            return ConfigError(f"hygiene.{name}: {why} (got {getattr(self, name)!r})")

        if self.pii not in ("redact", "drop", "fail", "off"):
            raise bad("pii", "must be one of redact, drop, fail, off")
        if self.dedup not in ("exact", "near", "off"):
            raise bad("dedup", "must be one of exact, near, off")
        if self.pii_types is not None:
            try:
                object.__setattr__(self, "pii_types", tuple(_pii.check_types(self.pii_types)))
            except ValueError as e:
                raise ConfigError(f"hygiene.pii_types: {e}") from None
        if not 0.0 < self.near_threshold <= 1.0:
            raise bad("near_threshold", "must be in (0, 1]")
        if not 0 <= self.ngram <= 64:
            raise bad("ngram", "must be between 0 (off) and 64")
        if not 1 <= self.decontam_min_ngram <= 64:
            raise bad("decontam_min_ngram", "must be between 1 and 64")
        if not 1 <= self.shingle_size <= 64:
            raise bad("shingle_size", "must be between 1 and 64")
        if not 16 <= self.num_perm <= 1024:
            raise bad("num_perm", "must be between 16 and 1024")


_COUNTS = ("records_in", "records_out", "pii_records", "pii_redacted", "pii_dropped",
           "contaminated", "exact_dups", "near_dups")


@dataclass
class HygieneStats:
    """Counts only. `pii` counts findings per type; the other fields count records.

    `sources` holds the same counts per source name. `as_dict()` flattens everything into
    MLflow metric names: `hygiene.records_in`, `hygiene.pii.email`,
    `hygiene.source.<name>.exact_dups`, ...
    """

    records_in: int = 0
    records_out: int = 0
    pii_records: int = 0  # records with at least one finding
    pii_redacted: int = 0
    pii_dropped: int = 0
    contaminated: int = 0
    exact_dups: int = 0
    near_dups: int = 0
    pii: dict[str, int] = field(default_factory=dict)
    sources: dict[str, HygieneStats] = field(default_factory=dict)

    @property
    def dropped(self) -> int:
        return self.pii_dropped + self.contaminated + self.exact_dups + self.near_dups

    def as_dict(self, prefix: str = "hygiene") -> dict[str, int]:
        out = {f"{prefix}.{k}": getattr(self, k) for k in _COUNTS}
        out[f"{prefix}.dropped"] = self.dropped
        out.update({f"{prefix}.pii.{t}": n for t, n in self.pii.items()})
        for name, s in self.sources.items():
            out.update(s.as_dict(f"{prefix}.source.{_metric_name(name)}"))
        return out

    def add(self, other: HygieneStats) -> None:
        """Add `other`'s counts to these (per source too): the counts of shards, summed."""
        for k in _COUNTS:
            setattr(self, k, getattr(self, k) + getattr(other, k))
        for t, n in other.pii.items():
            self.pii[t] = self.pii.get(t, 0) + n
        for name, s in other.sources.items():
            self.sources.setdefault(name, HygieneStats(pii=dict.fromkeys(self.pii, 0))).add(s)

    def to_state(self) -> dict:
        d = {k: getattr(self, k) for k in _COUNTS}
        d["pii"] = dict(self.pii)
        d["sources"] = {n: s.to_state() for n, s in self.sources.items()}
        return d

    @classmethod
    def from_state(cls, d: dict) -> HygieneStats:
        s = cls(**{k: int(d[k]) for k in _COUNTS}, pii={t: int(n) for t, n in d["pii"].items()})
        s.sources = {n: cls.from_state(v) for n, v in d["sources"].items()}
        return s


def _metric_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_\-/ ]", "_", name) or "_"


class Hygiene:
    """Apply `HygieneConfig` to streams of `(record_number, text)`; see the module docstring.

    `eval_texts` (all evaluation sets of the recipe) are tokenised once into an n-gram index.
    The dedup indexes keep a bounded part in memory and spill the rest under `spill_dir` (the
    system's temporary folder when None), so memory does not grow with the corpus.
    `state_dict()` / `load_state_dict()` carry the dedup digests, MinHash signatures and
    counts (plain ints and bytes, no text) so that a resumed run drops exactly what an
    uninterrupted run would; the n-gram index is rebuilt from `eval_texts`.
    """

    def __init__(self, cfg: HygieneConfig | None = None, eval_texts: Iterable[str] = (),
                 spill_dir: str | os.PathLike | None = None, ngrams: NgramIndex | None = None):
        self.cfg = cfg = cfg or HygieneConfig()
        self._types = cfg.pii_types or PII_TYPES
        self._hash = WordHasher()
        self._exact = ExactIndex(spill_dir) if cfg.dedup != "off" else None
        self._near = MinHashLSH(cfg.near_threshold, cfg.num_perm, spill_dir=spill_dir) if cfg.dedup == "near" else None
        self._decontam = None
        if cfg.ngram:  # `ngrams`: the index already built from the eval texts (a worker gets it)
            index = ngrams if ngrams is not None else NgramIndex(eval_texts, cfg.ngram, cfg.decontam_min_ngram,
                                                                 self._hash)
            self._decontam = index if len(index) else None
        self.stats = self._new_stats()

    def _new_stats(self) -> HygieneStats:
        return HygieneStats(pii={t: 0 for t in self._types} if self.cfg.pii != "off" else {})

    @property
    def eval_ngrams(self) -> int:
        """How many distinct eval n-grams the decontamination index holds."""
        return len(self._decontam) if self._decontam else 0

    def process(self, source: str, records: Iterable[tuple[int, str]], *, pii: bool = True
                ) -> Iterator[tuple[int, str]]:
        """Yield the surviving `(number, text)` records of `source`, lazily and in order.

        `pii=False` skips the PII step for this source (e.g. a public, non-proprietary mix)
        while still deduplicating it against the others. With `cfg.pii == "fail"`, iterating
        raises `ForgeError` at the first record with a finding, naming the source, the record
        number and the types found, never the value.
        """
        src = self.stats.sources.get(source)
        if src is None:
            src = self.stats.sources[source] = HygieneStats(pii={t: 0 for t in self.stats.pii})
        both = (self.stats, src)
        do_pii = pii and self.cfg.pii != "off"
        for number, text in records:
            for s in both:
                s.records_in += 1
            out = self._one(source, number, text, both, do_pii)
            if out is not None:
                for s in both:
                    s.records_out += 1
                yield number, out

    def _one(self, source: str, number: int, text: str, both, do_pii: bool) -> str | None:
        found: list[Finding] = scan_pii(text, self._types) if do_pii else []
        if found:
            for s in both:
                s.pii_records += 1
                for f in found:
                    s.pii[f.type] = s.pii.get(f.type, 0) + 1
            if self.cfg.pii == "fail":
                kinds = sorted({f.type for f in found}, key=PII_TYPES.index)
                raise ForgeError(
                    f"hygiene: source {source!r}, record {number}: found {len(found)} PII/secret "
                    f"finding(s) of type {', '.join(kinds)} (values not shown); with hygiene.pii "
                    "'fail' such data is refused — clean it, or set hygiene.pii to 'redact' or 'drop'"
                )
            if self.cfg.pii == "drop":
                for s in both:
                    s.pii_dropped += 1
                return None
        wh = None
        if self._decontam is not None:
            wh = self._hash(words(text))
            if self._decontam.contaminated(wh):
                for s in both:
                    s.contaminated += 1
                return None
        if found:
            text = redact(text, found)
            wh = None
            for s in both:
                s.pii_redacted += 1
        if self._exact is not None and self._exact.seen_or_add(text):
            for s in both:
                s.exact_dups += 1
            return None
        if self._near is not None:
            sh = shingles(wh if wh is not None else self._hash(words(text)), self.cfg.shingle_size)
            if len(sh) and self._near.seen_or_add(self._near.signature(sh)):
                for s in both:
                    s.near_dups += 1
                return None
        return text

    # ------------------------------------------------------------------ resume

    def state_dict(self) -> dict:
        """Dedup digests, MinHash signatures, counts and the dedup settings as plain ints, floats,
        strs and bytes (no text); `torch.save` and `torch.load(weights_only=True)` handle it."""
        return {
            "version": _STATE_VERSION,
            "config": {k: v for k, v in asdict(self.cfg).items() if k in _DEDUP_KEYS},
            "exact": self._exact.state() if self._exact is not None else b"",
            "near": self._near.state() if self._near is not None else b"",
            "stats": self.stats.to_state(),
        }

    def load_state_dict(self, state: dict) -> None:
        if state.get("version") != _STATE_VERSION:
            raise ForgeError(f"hygiene state version {state.get('version')!r} is not {_STATE_VERSION}")
        mine = {k: v for k, v in asdict(self.cfg).items() if k in _DEDUP_KEYS}
        if state["config"] != mine:
            raise ForgeError(f"hygiene state was saved with {state['config']}, this run has {mine}; "
                             "resume with the same hygiene settings")
        if self._exact is not None:
            self._exact.load(state["exact"])
        if self._near is not None:
            self._near.load(state["near"])
        self.stats = HygieneStats.from_state(state["stats"])


_DEDUP_KEYS = {f.name for f in fields(HygieneConfig)} - {"pii", "pii_types", "ngram", "decontam_min_ngram",
                                                         "decontaminate_against"}
