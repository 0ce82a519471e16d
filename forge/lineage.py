"""Lineage: where a Novella came from (base, each stage's settings, data hashes and tokens, metrics)."""
from __future__ import annotations

import datetime as dt
import json
import shutil
from pathlib import Path

import forge
from forge.data.sources import Source
from forge.files import atomic_dir
from forge.recipe import Recipe


def source_record(src: Source, fingerprint: str, used: Source) -> dict:
    """A data source as read (`src`) and as trained on (`used`: the hygiene cache, if cleaned)."""
    record = {"location": src.location, "files": [str(p) for p in src.files], "format": src.format,
              "text_fields": list(src.text_fields), "proprietary": src.proprietary, "bytes": src.size_bytes,
              "sha256": fingerprint, "tokens": 0, "skipped_records": 0}
    if used is not src:
        record["cleaned"] = {"file": str(used.files[0]), "sha256": used.fingerprint()}
    return record


def new_lineage(recipe: Recipe, base_checkpoint: Path) -> dict:
    base = recipe.base if isinstance(recipe.base, str) else {"scratch": recipe.base.scratch.model_dump()}
    return {
        "name": recipe.name,
        "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "forge_version": forge.__version__,
        "base": {"spec": base, "checkpoint": str(base_checkpoint)},
        "data": {},
        "stages": [],
        "metrics": {},
    }


def write_novella(checkpoint: Path, out: Path, lineage: dict) -> Path:
    """The Novella folder: the final checkpoint's weights, tokenizer and config, plus lineage.json."""
    with atomic_dir(out) as tmp:
        for item in Path(checkpoint).iterdir():
            if item.name not in ("forge_state.json", "training_state.pt", "manifest.json"):  # run state, not the model
                (shutil.copytree if item.is_dir() else shutil.copy2)(item, tmp / item.name)
        (tmp / "lineage.json").write_text(json.dumps(lineage, indent=2))
    return out
