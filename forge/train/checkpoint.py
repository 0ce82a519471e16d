"""Checkpoints in Hugging Face format, written atomically (a crash never leaves half a folder)."""
from __future__ import annotations

import json
from pathlib import Path

from forge.files import atomic_dir


def save_checkpoint(model, tokenizer, path: Path, state: dict | None = None) -> Path:
    """save_pretrained (safetensors) + tokenizer + `forge_state.json` (step, data loader position)."""
    with atomic_dir(path) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        if state is not None:
            (tmp / "forge_state.json").write_text(json.dumps(state, indent=2))
    return Path(path)
