"""Hygiene as a one-time pass before training: each source with hygiene on is read once, in recipe
order, through one shared `Hygiene` (so duplicates across sources are caught, the first copy
kept), and the surviving, redacted text is cached as JSONL keyed by the raw data's fingerprints
and the settings. Training then reads the cache, epoch after epoch, like any other source.
"""
from __future__ import annotations

import hashlib
import json
import tempfile
from dataclasses import asdict, replace
from pathlib import Path

from forge.data.hygiene import Hygiene, HygieneConfig
from forge.data.sources import Source
from forge.files import atomic_dir
from forge.progress import phase


def clean_sources(cfg: HygieneConfig, sources: dict[str, Source], todo: list[str], fingerprints: dict[str, str],
                  out_dir: Path) -> tuple[dict[str, Source], dict[str, int]]:
    """`sources` with those named in `todo` replaced by their cleaned cache, deduplicated across
    each other and decontaminated against `cfg.decontaminate_against`; returns (sources, counts)."""
    evals = list(cfg.decontaminate_against)
    if not todo:
        return sources, {}
    key_data = {"settings": asdict(cfg), "sources": {n: fingerprints[n] for n in todo},
                "evals": {n: fingerprints[n] for n in evals}}
    key = hashlib.sha256(json.dumps(key_data, sort_keys=True).encode()).hexdigest()[:16]
    cache = out_dir / f"clean-{key}"
    if not (cache / "stats.json").is_file():
        eval_texts = (text for n in evals for _, text in sources[n].records())
        out_dir.mkdir(parents=True, exist_ok=True)
        # The dedup indexes spill beside the cache (in the run folder), and go when this ends.
        with tempfile.TemporaryDirectory(prefix="dedup-", dir=out_dir) as spill, atomic_dir(cache) as tmp:
            hygiene = Hygiene(cfg, eval_texts, spill_dir=spill)
            for name in todo:
                with phase(f"data: cleaning {name} (PII, secrets, duplicates)"), \
                        open(tmp / f"{name}.jsonl", "w", encoding="utf-8") as f:
                    for number, text in hygiene.process(name, sources[name].records()):
                        f.write(json.dumps({"record": number, "text": text}) + "\n")
            (tmp / "stats.json").write_text(json.dumps(hygiene.stats.as_dict(), indent=1))
    cleaned = dict(sources)
    for name in todo:
        cleaned[name] = replace(sources[name], files=(cache / f"{name}.jsonl",), format="jsonl",
                                text_fields=("text",), saved_dataset=None, hub=None, on_error="fail", skipped={})
    return cleaned, json.loads((cache / "stats.json").read_text())
