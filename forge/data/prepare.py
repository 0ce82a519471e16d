"""Hygiene as a one-time pass before training: the sources with hygiene on are cleaned together, in
recipe order (so duplicates across sources are caught, the first copy kept), in shards spread over
worker processes (forge.data.cleanshards: the same output as one streaming `Hygiene`, whatever the
number of workers), and the surviving, redacted text is cached as JSONL keyed by the raw data's
fingerprints and the settings. Training then reads the cache, epoch after epoch, like any other source.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import asdict, replace
from pathlib import Path

from forge.data.cleanshards import clean_in_shards
from forge.data.dedup import NgramIndex
from forge.data.hygiene import HygieneConfig
from forge.data.objstore import get_dir, put_dir
from forge.data.parallel import Engine, PrepareConfig
from forge.data.sources import Source
from forge.files import atomic_dir
from forge.progress import phase


def clean_sources(cfg: HygieneConfig, sources: dict[str, Source], todo: list[str], fingerprints: dict[str, str],
                  out_dir: Path, prepare: PrepareConfig | None = None) -> tuple[dict[str, Source], dict[str, int]]:
    """`sources` with those named in `todo` replaced by their cleaned cache, deduplicated across
    each other and decontaminated against `cfg.decontaminate_against`; returns (sources, counts).
    The cache does not depend on `prepare` (how many workers made it)."""
    evals = list(cfg.decontaminate_against)
    if not todo:
        return sources, {}
    key_data = {"settings": asdict(cfg), "sources": {n: fingerprints[n] for n in todo},
                "evals": {n: fingerprints[n] for n in evals}}
    key = hashlib.sha256(json.dumps(key_data, sort_keys=True).encode()).hexdigest()[:16]
    cache = out_dir / f"clean-{key}"
    shared = f"{prepare.cache.rstrip('/')}/clean-{key}" if prepare is not None and prepare.cache else None
    if not (cache / "stats.json").is_file() and shared is not None:  # another node may have made it
        with phase(f"data: looking for the cleaned cache at {shared}"):
            fetched = _fetch(shared, cache)
        if fetched:
            shared = None
    if not (cache / "stats.json").is_file():
        workers = (prepare or PrepareConfig()).processes
        out_dir.mkdir(parents=True, exist_ok=True)
        # shard files and dedup keys spill beside the cache (in the run folder), and go when this ends
        with tempfile.TemporaryDirectory(prefix="dedup-", dir=out_dir) as spill, atomic_dir(cache) as tmp:
            ngrams = None
            if cfg.ngram and evals:
                with phase(f"data: indexing the n-grams of {', '.join(evals)} (decontamination)"):
                    index = NgramIndex((t for n in evals for _, t in sources[n].records()), cfg.ngram,
                                       cfg.decontam_min_ngram)
                    ngrams = index if len(index) else None
            with phase(f"data: cleaning {', '.join(todo)} (PII, secrets, duplicates) with {workers} worker(s)"):
                with Engine(workers, prepare) as engine:
                    stats = clean_in_shards(cfg, sources, todo, ngrams, tmp, Path(spill), engine)
            (tmp / "stats.json").write_text(json.dumps(stats.as_dict(), indent=1))
        if shared is not None:
            with phase(f"data: sharing the cleaned cache at {shared}"):
                put_dir(cache, shared, "stats.json")
    cleaned = dict(sources)
    for name in todo:
        cleaned[name] = replace(sources[name], files=(cache / f"{name}.jsonl",), format="jsonl",
                                text_fields=("text",), saved_dataset=None, hub=None, on_error="fail", skipped={})
    return cleaned, json.loads((cache / "stats.json").read_text())


def _fetch(url: str, cache: Path) -> bool:
    """The cleaned cache from the object store into `cache` (whole, or not at all)."""
    part = cache.with_name(cache.name + ".fetch")
    shutil.rmtree(part, ignore_errors=True)
    try:
        if not get_dir(url, part, "stats.json"):
            return False
        os.replace(part, cache)
        return True
    finally:
        shutil.rmtree(part, ignore_errors=True)
