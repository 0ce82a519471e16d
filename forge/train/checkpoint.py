"""Checkpoints in Hugging Face format, written atomically (a crash never leaves half a folder)."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path


def save_checkpoint(model, tokenizer, path: Path, state: dict | None = None) -> Path:
    """save_pretrained (safetensors) + tokenizer + `forge_state.json`, into a temp folder then renamed."""
    path = Path(path)
    tmp = path.with_name(path.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    if state is not None:
        (tmp / "forge_state.json").write_text(json.dumps(state, indent=2))
    if path.exists():
        old = path.with_name(path.name + ".old")
        shutil.rmtree(old, ignore_errors=True)
        os.replace(path, old)
        os.replace(tmp, path)
        shutil.rmtree(old)
    else:
        os.replace(tmp, path)
    return path
